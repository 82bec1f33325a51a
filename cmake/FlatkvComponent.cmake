# flatkv_component(NAME DIRS dir... [EXCLUDE regex...] [SOURCES file...]
#                  [PUBLIC dep...] [PRIVATE dep...])
#
# One component of flatkv (docs/architecture.md, "Components"): the static library flatkv_NAME
# (alias flatkv::NAME, exported as flatkv::NAME) of every src/DIR/*.cc but the tests, with the
# public headers (include/) for its users and src/ for itself. PUBLIC: the components (and
# libraries) its users reach through it; PRIVATE: what only its own sources include.
# Position-independent, so the Python module (a shared object) can link it. SIMD fast paths
# live in their own files, chosen at run time (common/cpu.h): *_avx2.cc may use AVX2, FMA and
# F16C; *_avx512.cc AVX-512 F/BW/VL/DQ too.
function(flatkv_component name)
  cmake_parse_arguments(C "" "" "DIRS;EXCLUDE;SOURCES;PUBLIC;PRIVATE" ${ARGN})
  set(sources ${C_SOURCES})
  foreach(dir ${C_DIRS})
    file(GLOB dir_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${dir}/*.cc)
    list(APPEND sources ${dir_sources})
  endforeach()
  list(FILTER sources EXCLUDE REGEX "_test\\.cc$")
  foreach(regex ${C_EXCLUDE})
    list(FILTER sources EXCLUDE REGEX "${regex}")
  endforeach()
  foreach(src ${sources})
    if(src MATCHES "_avx2\\.cc$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c" SKIP_PRECOMPILE_HEADERS ON)
    elseif(src MATCHES "_avx512\\.cc$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS
        "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx2;-mfma;-mf16c" SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
  add_library(flatkv_${name} STATIC ${sources})
  add_library(flatkv::${name} ALIAS flatkv_${name})
  flatkv_precompile(flatkv_${name} ${PROJECT_SOURCE_DIR}/src/common/precompiled.h)
  set_target_properties(flatkv_${name} PROPERTIES EXPORT_NAME ${name} POSITION_INDEPENDENT_CODE ON)
  target_compile_features(flatkv_${name} PUBLIC cxx_std_20)  # the public headers are C++20
  target_include_directories(flatkv_${name}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(flatkv_${name} PUBLIC ${C_PUBLIC} PRIVATE ${C_PRIVATE})
endfunction()

# flatkv_precompile(TARGET HEADER...): TARGET's C++ sources are compiled with HEADERs precompiled
# (once per target: gcc's and clang's precompiled headers hold one target's flags). Sources with
# their own instruction-set flags (*_avx2.cc) set SKIP_PRECOMPILE_HEADERS. Off with
# -DFLATKV_PCH=OFF, which checks that every source includes what it uses.
#
# GCC 12 loses, under a precompiled header, the system-header status of libstdc++'s code that
# it inlines, and reports its own std::string memcpy as -Warray-bounds, -Wstringop-overflow and
# -Wstringop-overread (a source compiled with -include of the same header and no .gch reports
# nothing): those three are off where GCC uses a precompiled header. -DFLATKV_PCH=OFF keeps them.
function(flatkv_precompile target)
  if(FLATKV_PCH)
    foreach(header ${ARGN})
      target_precompile_headers(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${header}>")
    endforeach()
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      target_compile_options(${target} PRIVATE
        $<$<COMPILE_LANGUAGE:CXX>:-Wno-array-bounds -Wno-stringop-overflow -Wno-stringop-overread>)
    endif()
  endif()
endfunction()

# flatkv_link_included(TARGET FILE...): links TARGET to the component of each src/ folder
# that FILEs include ("model/gguf.h": flatkv_model; a core folder: flatkv_core), so a program
# of a few files (a fuzz target) links only what it includes.
function(flatkv_link_included target)
  set(components "")
  foreach(file ${ARGN})
    file(STRINGS ${file} includes REGEX "^#include \"[a-z_]+/")
    foreach(line ${includes})
      string(REGEX REPLACE "^#include \"([a-z_]+)/.*" "\\1" dir "${line}")
      if(dir MATCHES "^(common|keys|io|media|persist|codec|store|flatkv)$")
        list(APPEND components flatkv_core)
      elseif(TARGET flatkv_${dir})
        list(APPEND components flatkv_${dir})
      endif()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES components)
  target_link_libraries(${target} PRIVATE ${components})
endfunction()
