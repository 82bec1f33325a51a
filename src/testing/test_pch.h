// The precompiled header of the test executables (flatkv_test_target in CMakeLists.txt): the
// standard headers of common/precompiled.h and GoogleTest, whose parse alone took about 3 s a
// test source. Tests still include what they use: this only speeds their build.
#pragma once

#include "common/precompiled.h"

#include <gtest/gtest.h>
