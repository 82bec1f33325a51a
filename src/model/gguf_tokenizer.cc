#include "model/gguf_tokenizer.h"

#include <algorithm>
#include <climits>
#include <queue>
#include <unordered_map>

namespace flatkv::model {
namespace {

std::string Num(uint64_t v) { return std::to_string(v); }

// llama.cpp's token types (tokenizer.ggml.token_type).
enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// ---- Unicode ------------------------------------------------------------

// Length of the UTF-8 sequence a lead byte announces (1 for ASCII and for a
// stray continuation byte), as llama.cpp's unicode_len_utf8.
size_t Utf8Len(unsigned char c) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[c >> 4];
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes the codepoint at s[i] as llama.cpp's unicode_cpt_from_utf8 does
// (lead and continuation bits checked, overlong forms accepted). An invalid
// sequence yields U+FFFD spanning one byte.
uint32_t DecodeUtf8(std::string_view s, size_t i, size_t* len) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  auto cont = [&](size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  unsigned char c = b(0);
  *len = 1;
  if (c < 0x80) return c;
  if ((c & 0xE0) == 0xC0 && cont(1)) {
    *len = 2;
    return ((c & 0x1Fu) << 6) | (b(1) & 0x3Fu);
  }
  if ((c & 0xF0) == 0xE0 && cont(1) && cont(2)) {
    *len = 3;
    return ((c & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu);
  }
  if ((c & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
    *len = 4;
    return ((c & 0x07u) << 18) | ((b(1) & 0x3Fu) << 12) | ((b(2) & 0x3Fu) << 6) | (b(3) & 0x3Fu);
  }
  return 0xFFFD;
}

struct CpRange {
  uint32_t first, last;
};

// Unicode general categories L* (letters) and N* (numbers) as sorted,
// disjoint codepoint ranges, generated from the Unicode 14.0 database
// (Python's unicodedata) for the GPT-2 pre-tokenizer's \p{L} and \p{N}.
// clang-format off
constexpr CpRange kLetters[] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xAA, 0xAA}, {0xB5, 0xB5}, {0xBA, 0xBA}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x2C1},
    {0x2C6, 0x2D1}, {0x2E0, 0x2E4}, {0x2EC, 0x2EC}, {0x2EE, 0x2EE}, {0x370, 0x374}, {0x376, 0x377}, {0x37A, 0x37D},
    {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481},
    {0x48A, 0x52F}, {0x531, 0x556}, {0x559, 0x559}, {0x560, 0x588}, {0x5D0, 0x5EA}, {0x5EF, 0x5F2}, {0x620, 0x64A},
    {0x66E, 0x66F}, {0x671, 0x6D3}, {0x6D5, 0x6D5}, {0x6E5, 0x6E6}, {0x6EE, 0x6EF}, {0x6FA, 0x6FC}, {0x6FF, 0x6FF},
    {0x710, 0x710}, {0x712, 0x72F}, {0x74D, 0x7A5}, {0x7B1, 0x7B1}, {0x7CA, 0x7EA}, {0x7F4, 0x7F5}, {0x7FA, 0x7FA},
    {0x800, 0x815}, {0x81A, 0x81A}, {0x824, 0x824}, {0x828, 0x828}, {0x840, 0x858}, {0x860, 0x86A}, {0x870, 0x887},
    {0x889, 0x88E}, {0x8A0, 0x8C9}, {0x904, 0x939}, {0x93D, 0x93D}, {0x950, 0x950}, {0x958, 0x961}, {0x971, 0x980},
    {0x985, 0x98C}, {0x98F, 0x990}, {0x993, 0x9A8}, {0x9AA, 0x9B0}, {0x9B2, 0x9B2}, {0x9B6, 0x9B9}, {0x9BD, 0x9BD},
    {0x9CE, 0x9CE}, {0x9DC, 0x9DD}, {0x9DF, 0x9E1}, {0x9F0, 0x9F1}, {0x9FC, 0x9FC}, {0xA05, 0xA0A}, {0xA0F, 0xA10},
    {0xA13, 0xA28}, {0xA2A, 0xA30}, {0xA32, 0xA33}, {0xA35, 0xA36}, {0xA38, 0xA39}, {0xA59, 0xA5C}, {0xA5E, 0xA5E},
    {0xA72, 0xA74}, {0xA85, 0xA8D}, {0xA8F, 0xA91}, {0xA93, 0xAA8}, {0xAAA, 0xAB0}, {0xAB2, 0xAB3}, {0xAB5, 0xAB9},
    {0xABD, 0xABD}, {0xAD0, 0xAD0}, {0xAE0, 0xAE1}, {0xAF9, 0xAF9}, {0xB05, 0xB0C}, {0xB0F, 0xB10}, {0xB13, 0xB28},
    {0xB2A, 0xB30}, {0xB32, 0xB33}, {0xB35, 0xB39}, {0xB3D, 0xB3D}, {0xB5C, 0xB5D}, {0xB5F, 0xB61}, {0xB71, 0xB71},
    {0xB83, 0xB83}, {0xB85, 0xB8A}, {0xB8E, 0xB90}, {0xB92, 0xB95}, {0xB99, 0xB9A}, {0xB9C, 0xB9C}, {0xB9E, 0xB9F},
    {0xBA3, 0xBA4}, {0xBA8, 0xBAA}, {0xBAE, 0xBB9}, {0xBD0, 0xBD0}, {0xC05, 0xC0C}, {0xC0E, 0xC10}, {0xC12, 0xC28},
    {0xC2A, 0xC39}, {0xC3D, 0xC3D}, {0xC58, 0xC5A}, {0xC5D, 0xC5D}, {0xC60, 0xC61}, {0xC80, 0xC80}, {0xC85, 0xC8C},
    {0xC8E, 0xC90}, {0xC92, 0xCA8}, {0xCAA, 0xCB3}, {0xCB5, 0xCB9}, {0xCBD, 0xCBD}, {0xCDD, 0xCDE}, {0xCE0, 0xCE1},
    {0xCF1, 0xCF2}, {0xD04, 0xD0C}, {0xD0E, 0xD10}, {0xD12, 0xD3A}, {0xD3D, 0xD3D}, {0xD4E, 0xD4E}, {0xD54, 0xD56},
    {0xD5F, 0xD61}, {0xD7A, 0xD7F}, {0xD85, 0xD96}, {0xD9A, 0xDB1}, {0xDB3, 0xDBB}, {0xDBD, 0xDBD}, {0xDC0, 0xDC6},
    {0xE01, 0xE30}, {0xE32, 0xE33}, {0xE40, 0xE46}, {0xE81, 0xE82}, {0xE84, 0xE84}, {0xE86, 0xE8A}, {0xE8C, 0xEA3},
    {0xEA5, 0xEA5}, {0xEA7, 0xEB0}, {0xEB2, 0xEB3}, {0xEBD, 0xEBD}, {0xEC0, 0xEC4}, {0xEC6, 0xEC6}, {0xEDC, 0xEDF},
    {0xF00, 0xF00}, {0xF40, 0xF47}, {0xF49, 0xF6C}, {0xF88, 0xF8C}, {0x1000, 0x102A}, {0x103F, 0x103F},
    {0x1050, 0x1055}, {0x105A, 0x105D}, {0x1061, 0x1061}, {0x1065, 0x1066}, {0x106E, 0x1070}, {0x1075, 0x1081},
    {0x108E, 0x108E}, {0x10A0, 0x10C5}, {0x10C7, 0x10C7}, {0x10CD, 0x10CD}, {0x10D0, 0x10FA}, {0x10FC, 0x1248},
    {0x124A, 0x124D}, {0x1250, 0x1256}, {0x1258, 0x1258}, {0x125A, 0x125D}, {0x1260, 0x1288}, {0x128A, 0x128D},
    {0x1290, 0x12B0}, {0x12B2, 0x12B5}, {0x12B8, 0x12BE}, {0x12C0, 0x12C0}, {0x12C2, 0x12C5}, {0x12C8, 0x12D6},
    {0x12D8, 0x1310}, {0x1312, 0x1315}, {0x1318, 0x135A}, {0x1380, 0x138F}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD},
    {0x1401, 0x166C}, {0x166F, 0x167F}, {0x1681, 0x169A}, {0x16A0, 0x16EA}, {0x16F1, 0x16F8}, {0x1700, 0x1711},
    {0x171F, 0x1731}, {0x1740, 0x1751}, {0x1760, 0x176C}, {0x176E, 0x1770}, {0x1780, 0x17B3}, {0x17D7, 0x17D7},
    {0x17DC, 0x17DC}, {0x1820, 0x1878}, {0x1880, 0x1884}, {0x1887, 0x18A8}, {0x18AA, 0x18AA}, {0x18B0, 0x18F5},
    {0x1900, 0x191E}, {0x1950, 0x196D}, {0x1970, 0x1974}, {0x1980, 0x19AB}, {0x19B0, 0x19C9}, {0x1A00, 0x1A16},
    {0x1A20, 0x1A54}, {0x1AA7, 0x1AA7}, {0x1B05, 0x1B33}, {0x1B45, 0x1B4C}, {0x1B83, 0x1BA0}, {0x1BAE, 0x1BAF},
    {0x1BBA, 0x1BE5}, {0x1C00, 0x1C23}, {0x1C4D, 0x1C4F}, {0x1C5A, 0x1C7D}, {0x1C80, 0x1C88}, {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF}, {0x1CE9, 0x1CEC}, {0x1CEE, 0x1CF3}, {0x1CF5, 0x1CF6}, {0x1CFA, 0x1CFA}, {0x1D00, 0x1DBF},
    {0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE},
    {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4},
    {0x1FF6, 0x1FFC}, {0x2071, 0x2071}, {0x207F, 0x207F}, {0x2090, 0x209C}, {0x2102, 0x2102}, {0x2107, 0x2107},
    {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
    {0x212A, 0x212D}, {0x212F, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184},
    {0x2C00, 0x2CE4}, {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0x2D00, 0x2D25}, {0x2D27, 0x2D27}, {0x2D2D, 0x2D2D},
    {0x2D30, 0x2D67}, {0x2D6F, 0x2D6F}, {0x2D80, 0x2D96}, {0x2DA0, 0x2DA6}, {0x2DA8, 0x2DAE}, {0x2DB0, 0x2DB6},
    {0x2DB8, 0x2DBE}, {0x2DC0, 0x2DC6}, {0x2DC8, 0x2DCE}, {0x2DD0, 0x2DD6}, {0x2DD8, 0x2DDE}, {0x2E2F, 0x2E2F},
    {0x3005, 0x3006}, {0x3031, 0x3035}, {0x303B, 0x303C}, {0x3041, 0x3096}, {0x309D, 0x309F}, {0x30A1, 0x30FA},
    {0x30FC, 0x30FF}, {0x3105, 0x312F}, {0x3131, 0x318E}, {0x31A0, 0x31BF}, {0x31F0, 0x31FF}, {0x3400, 0x4DBF},
    {0x4E00, 0xA48C}, {0xA4D0, 0xA4FD}, {0xA500, 0xA60C}, {0xA610, 0xA61F}, {0xA62A, 0xA62B}, {0xA640, 0xA66E},
    {0xA67F, 0xA69D}, {0xA6A0, 0xA6E5}, {0xA717, 0xA71F}, {0xA722, 0xA788}, {0xA78B, 0xA7CA}, {0xA7D0, 0xA7D1},
    {0xA7D3, 0xA7D3}, {0xA7D5, 0xA7D9}, {0xA7F2, 0xA801}, {0xA803, 0xA805}, {0xA807, 0xA80A}, {0xA80C, 0xA822},
    {0xA840, 0xA873}, {0xA882, 0xA8B3}, {0xA8F2, 0xA8F7}, {0xA8FB, 0xA8FB}, {0xA8FD, 0xA8FE}, {0xA90A, 0xA925},
    {0xA930, 0xA946}, {0xA960, 0xA97C}, {0xA984, 0xA9B2}, {0xA9CF, 0xA9CF}, {0xA9E0, 0xA9E4}, {0xA9E6, 0xA9EF},
    {0xA9FA, 0xA9FE}, {0xAA00, 0xAA28}, {0xAA40, 0xAA42}, {0xAA44, 0xAA4B}, {0xAA60, 0xAA76}, {0xAA7A, 0xAA7A},
    {0xAA7E, 0xAAAF}, {0xAAB1, 0xAAB1}, {0xAAB5, 0xAAB6}, {0xAAB9, 0xAABD}, {0xAAC0, 0xAAC0}, {0xAAC2, 0xAAC2},
    {0xAADB, 0xAADD}, {0xAAE0, 0xAAEA}, {0xAAF2, 0xAAF4}, {0xAB01, 0xAB06}, {0xAB09, 0xAB0E}, {0xAB11, 0xAB16},
    {0xAB20, 0xAB26}, {0xAB28, 0xAB2E}, {0xAB30, 0xAB5A}, {0xAB5C, 0xAB69}, {0xAB70, 0xABE2}, {0xAC00, 0xD7A3},
    {0xD7B0, 0xD7C6}, {0xD7CB, 0xD7FB}, {0xF900, 0xFA6D}, {0xFA70, 0xFAD9}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17},
    {0xFB1D, 0xFB1D}, {0xFB1F, 0xFB28}, {0xFB2A, 0xFB36}, {0xFB38, 0xFB3C}, {0xFB3E, 0xFB3E}, {0xFB40, 0xFB41},
    {0xFB43, 0xFB44}, {0xFB46, 0xFBB1}, {0xFBD3, 0xFD3D}, {0xFD50, 0xFD8F}, {0xFD92, 0xFDC7}, {0xFDF0, 0xFDFB},
    {0xFE70, 0xFE74}, {0xFE76, 0xFEFC}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0xFF66, 0xFFBE}, {0xFFC2, 0xFFC7},
    {0xFFCA, 0xFFCF}, {0xFFD2, 0xFFD7}, {0xFFDA, 0xFFDC}, {0x10000, 0x1000B}, {0x1000D, 0x10026}, {0x10028, 0x1003A},
    {0x1003C, 0x1003D}, {0x1003F, 0x1004D}, {0x10050, 0x1005D}, {0x10080, 0x100FA}, {0x10280, 0x1029C},
    {0x102A0, 0x102D0}, {0x10300, 0x1031F}, {0x1032D, 0x10340}, {0x10342, 0x10349}, {0x10350, 0x10375},
    {0x10380, 0x1039D}, {0x103A0, 0x103C3}, {0x103C8, 0x103CF}, {0x10400, 0x1049D}, {0x104B0, 0x104D3},
    {0x104D8, 0x104FB}, {0x10500, 0x10527}, {0x10530, 0x10563}, {0x10570, 0x1057A}, {0x1057C, 0x1058A},
    {0x1058C, 0x10592}, {0x10594, 0x10595}, {0x10597, 0x105A1}, {0x105A3, 0x105B1}, {0x105B3, 0x105B9},
    {0x105BB, 0x105BC}, {0x10600, 0x10736}, {0x10740, 0x10755}, {0x10760, 0x10767}, {0x10780, 0x10785},
    {0x10787, 0x107B0}, {0x107B2, 0x107BA}, {0x10800, 0x10805}, {0x10808, 0x10808}, {0x1080A, 0x10835},
    {0x10837, 0x10838}, {0x1083C, 0x1083C}, {0x1083F, 0x10855}, {0x10860, 0x10876}, {0x10880, 0x1089E},
    {0x108E0, 0x108F2}, {0x108F4, 0x108F5}, {0x10900, 0x10915}, {0x10920, 0x10939}, {0x10980, 0x109B7},
    {0x109BE, 0x109BF}, {0x10A00, 0x10A00}, {0x10A10, 0x10A13}, {0x10A15, 0x10A17}, {0x10A19, 0x10A35},
    {0x10A60, 0x10A7C}, {0x10A80, 0x10A9C}, {0x10AC0, 0x10AC7}, {0x10AC9, 0x10AE4}, {0x10B00, 0x10B35},
    {0x10B40, 0x10B55}, {0x10B60, 0x10B72}, {0x10B80, 0x10B91}, {0x10C00, 0x10C48}, {0x10C80, 0x10CB2},
    {0x10CC0, 0x10CF2}, {0x10D00, 0x10D23}, {0x10E80, 0x10EA9}, {0x10EB0, 0x10EB1}, {0x10F00, 0x10F1C},
    {0x10F27, 0x10F27}, {0x10F30, 0x10F45}, {0x10F70, 0x10F81}, {0x10FB0, 0x10FC4}, {0x10FE0, 0x10FF6},
    {0x11003, 0x11037}, {0x11071, 0x11072}, {0x11075, 0x11075}, {0x11083, 0x110AF}, {0x110D0, 0x110E8},
    {0x11103, 0x11126}, {0x11144, 0x11144}, {0x11147, 0x11147}, {0x11150, 0x11172}, {0x11176, 0x11176},
    {0x11183, 0x111B2}, {0x111C1, 0x111C4}, {0x111DA, 0x111DA}, {0x111DC, 0x111DC}, {0x11200, 0x11211},
    {0x11213, 0x1122B}, {0x11280, 0x11286}, {0x11288, 0x11288}, {0x1128A, 0x1128D}, {0x1128F, 0x1129D},
    {0x1129F, 0x112A8}, {0x112B0, 0x112DE}, {0x11305, 0x1130C}, {0x1130F, 0x11310}, {0x11313, 0x11328},
    {0x1132A, 0x11330}, {0x11332, 0x11333}, {0x11335, 0x11339}, {0x1133D, 0x1133D}, {0x11350, 0x11350},
    {0x1135D, 0x11361}, {0x11400, 0x11434}, {0x11447, 0x1144A}, {0x1145F, 0x11461}, {0x11480, 0x114AF},
    {0x114C4, 0x114C5}, {0x114C7, 0x114C7}, {0x11580, 0x115AE}, {0x115D8, 0x115DB}, {0x11600, 0x1162F},
    {0x11644, 0x11644}, {0x11680, 0x116AA}, {0x116B8, 0x116B8}, {0x11700, 0x1171A}, {0x11740, 0x11746},
    {0x11800, 0x1182B}, {0x118A0, 0x118DF}, {0x118FF, 0x11906}, {0x11909, 0x11909}, {0x1190C, 0x11913},
    {0x11915, 0x11916}, {0x11918, 0x1192F}, {0x1193F, 0x1193F}, {0x11941, 0x11941}, {0x119A0, 0x119A7},
    {0x119AA, 0x119D0}, {0x119E1, 0x119E1}, {0x119E3, 0x119E3}, {0x11A00, 0x11A00}, {0x11A0B, 0x11A32},
    {0x11A3A, 0x11A3A}, {0x11A50, 0x11A50}, {0x11A5C, 0x11A89}, {0x11A9D, 0x11A9D}, {0x11AB0, 0x11AF8},
    {0x11C00, 0x11C08}, {0x11C0A, 0x11C2E}, {0x11C40, 0x11C40}, {0x11C72, 0x11C8F}, {0x11D00, 0x11D06},
    {0x11D08, 0x11D09}, {0x11D0B, 0x11D30}, {0x11D46, 0x11D46}, {0x11D60, 0x11D65}, {0x11D67, 0x11D68},
    {0x11D6A, 0x11D89}, {0x11D98, 0x11D98}, {0x11EE0, 0x11EF2}, {0x11FB0, 0x11FB0}, {0x12000, 0x12399},
    {0x12480, 0x12543}, {0x12F90, 0x12FF0}, {0x13000, 0x1342E}, {0x14400, 0x14646}, {0x16800, 0x16A38},
    {0x16A40, 0x16A5E}, {0x16A70, 0x16ABE}, {0x16AD0, 0x16AED}, {0x16B00, 0x16B2F}, {0x16B40, 0x16B43},
    {0x16B63, 0x16B77}, {0x16B7D, 0x16B8F}, {0x16E40, 0x16E7F}, {0x16F00, 0x16F4A}, {0x16F50, 0x16F50},
    {0x16F93, 0x16F9F}, {0x16FE0, 0x16FE1}, {0x16FE3, 0x16FE3}, {0x17000, 0x187F7}, {0x18800, 0x18CD5},
    {0x18D00, 0x18D08}, {0x1AFF0, 0x1AFF3}, {0x1AFF5, 0x1AFFB}, {0x1AFFD, 0x1AFFE}, {0x1B000, 0x1B122},
    {0x1B150, 0x1B152}, {0x1B164, 0x1B167}, {0x1B170, 0x1B2FB}, {0x1BC00, 0x1BC6A}, {0x1BC70, 0x1BC7C},
    {0x1BC80, 0x1BC88}, {0x1BC90, 0x1BC99}, {0x1D400, 0x1D454}, {0x1D456, 0x1D49C}, {0x1D49E, 0x1D49F},
    {0x1D4A2, 0x1D4A2}, {0x1D4A5, 0x1D4A6}, {0x1D4A9, 0x1D4AC}, {0x1D4AE, 0x1D4B9}, {0x1D4BB, 0x1D4BB},
    {0x1D4BD, 0x1D4C3}, {0x1D4C5, 0x1D505}, {0x1D507, 0x1D50A}, {0x1D50D, 0x1D514}, {0x1D516, 0x1D51C},
    {0x1D51E, 0x1D539}, {0x1D53B, 0x1D53E}, {0x1D540, 0x1D544}, {0x1D546, 0x1D546}, {0x1D54A, 0x1D550},
    {0x1D552, 0x1D6A5}, {0x1D6A8, 0x1D6C0}, {0x1D6C2, 0x1D6DA}, {0x1D6DC, 0x1D6FA}, {0x1D6FC, 0x1D714},
    {0x1D716, 0x1D734}, {0x1D736, 0x1D74E}, {0x1D750, 0x1D76E}, {0x1D770, 0x1D788}, {0x1D78A, 0x1D7A8},
    {0x1D7AA, 0x1D7C2}, {0x1D7C4, 0x1D7CB}, {0x1DF00, 0x1DF1E}, {0x1E100, 0x1E12C}, {0x1E137, 0x1E13D},
    {0x1E14E, 0x1E14E}, {0x1E290, 0x1E2AD}, {0x1E2C0, 0x1E2EB}, {0x1E7E0, 0x1E7E6}, {0x1E7E8, 0x1E7EB},
    {0x1E7ED, 0x1E7EE}, {0x1E7F0, 0x1E7FE}, {0x1E800, 0x1E8C4}, {0x1E900, 0x1E943}, {0x1E94B, 0x1E94B},
    {0x1EE00, 0x1EE03}, {0x1EE05, 0x1EE1F}, {0x1EE21, 0x1EE22}, {0x1EE24, 0x1EE24}, {0x1EE27, 0x1EE27},
    {0x1EE29, 0x1EE32}, {0x1EE34, 0x1EE37}, {0x1EE39, 0x1EE39}, {0x1EE3B, 0x1EE3B}, {0x1EE42, 0x1EE42},
    {0x1EE47, 0x1EE47}, {0x1EE49, 0x1EE49}, {0x1EE4B, 0x1EE4B}, {0x1EE4D, 0x1EE4F}, {0x1EE51, 0x1EE52},
    {0x1EE54, 0x1EE54}, {0x1EE57, 0x1EE57}, {0x1EE59, 0x1EE59}, {0x1EE5B, 0x1EE5B}, {0x1EE5D, 0x1EE5D},
    {0x1EE5F, 0x1EE5F}, {0x1EE61, 0x1EE62}, {0x1EE64, 0x1EE64}, {0x1EE67, 0x1EE6A}, {0x1EE6C, 0x1EE72},
    {0x1EE74, 0x1EE77}, {0x1EE79, 0x1EE7C}, {0x1EE7E, 0x1EE7E}, {0x1EE80, 0x1EE89}, {0x1EE8B, 0x1EE9B},
    {0x1EEA1, 0x1EEA3}, {0x1EEA5, 0x1EEA9}, {0x1EEAB, 0x1EEBB}, {0x20000, 0x2A6DF}, {0x2A700, 0x2B738},
    {0x2B740, 0x2B81D}, {0x2B820, 0x2CEA1}, {0x2CEB0, 0x2EBE0}, {0x2F800, 0x2FA1D}, {0x30000, 0x3134A},
};
constexpr CpRange kNumbers[] = {
    {0x30, 0x39}, {0xB2, 0xB3}, {0xB9, 0xB9}, {0xBC, 0xBE}, {0x660, 0x669}, {0x6F0, 0x6F9}, {0x7C0, 0x7C9},
    {0x966, 0x96F}, {0x9E6, 0x9EF}, {0x9F4, 0x9F9}, {0xA66, 0xA6F}, {0xAE6, 0xAEF}, {0xB66, 0xB6F}, {0xB72, 0xB77},
    {0xBE6, 0xBF2}, {0xC66, 0xC6F}, {0xC78, 0xC7E}, {0xCE6, 0xCEF}, {0xD58, 0xD5E}, {0xD66, 0xD78}, {0xDE6, 0xDEF},
    {0xE50, 0xE59}, {0xED0, 0xED9}, {0xF20, 0xF33}, {0x1040, 0x1049}, {0x1090, 0x1099}, {0x1369, 0x137C},
    {0x16EE, 0x16F0}, {0x17E0, 0x17E9}, {0x17F0, 0x17F9}, {0x1810, 0x1819}, {0x1946, 0x194F}, {0x19D0, 0x19DA},
    {0x1A80, 0x1A89}, {0x1A90, 0x1A99}, {0x1B50, 0x1B59}, {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49}, {0x1C50, 0x1C59},
    {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2150, 0x2182}, {0x2185, 0x2189}, {0x2460, 0x249B},
    {0x24EA, 0x24FF}, {0x2776, 0x2793}, {0x2CFD, 0x2CFD}, {0x3007, 0x3007}, {0x3021, 0x3029}, {0x3038, 0x303A},
    {0x3192, 0x3195}, {0x3220, 0x3229}, {0x3248, 0x324F}, {0x3251, 0x325F}, {0x3280, 0x3289}, {0x32B1, 0x32BF},
    {0xA620, 0xA629}, {0xA6E6, 0xA6EF}, {0xA830, 0xA835}, {0xA8D0, 0xA8D9}, {0xA900, 0xA909}, {0xA9D0, 0xA9D9},
    {0xA9F0, 0xA9F9}, {0xAA50, 0xAA59}, {0xABF0, 0xABF9}, {0xFF10, 0xFF19}, {0x10107, 0x10133}, {0x10140, 0x10178},
    {0x1018A, 0x1018B}, {0x102E1, 0x102FB}, {0x10320, 0x10323}, {0x10341, 0x10341}, {0x1034A, 0x1034A},
    {0x103D1, 0x103D5}, {0x104A0, 0x104A9}, {0x10858, 0x1085F}, {0x10879, 0x1087F}, {0x108A7, 0x108AF},
    {0x108FB, 0x108FF}, {0x10916, 0x1091B}, {0x109BC, 0x109BD}, {0x109C0, 0x109CF}, {0x109D2, 0x109FF},
    {0x10A40, 0x10A48}, {0x10A7D, 0x10A7E}, {0x10A9D, 0x10A9F}, {0x10AEB, 0x10AEF}, {0x10B58, 0x10B5F},
    {0x10B78, 0x10B7F}, {0x10BA9, 0x10BAF}, {0x10CFA, 0x10CFF}, {0x10D30, 0x10D39}, {0x10E60, 0x10E7E},
    {0x10F1D, 0x10F26}, {0x10F51, 0x10F54}, {0x10FC5, 0x10FCB}, {0x11052, 0x1106F}, {0x110F0, 0x110F9},
    {0x11136, 0x1113F}, {0x111D0, 0x111D9}, {0x111E1, 0x111F4}, {0x112F0, 0x112F9}, {0x11450, 0x11459},
    {0x114D0, 0x114D9}, {0x11650, 0x11659}, {0x116C0, 0x116C9}, {0x11730, 0x1173B}, {0x118E0, 0x118F2},
    {0x11950, 0x11959}, {0x11C50, 0x11C6C}, {0x11D50, 0x11D59}, {0x11DA0, 0x11DA9}, {0x11FC0, 0x11FD4},
    {0x12400, 0x1246E}, {0x16A60, 0x16A69}, {0x16AC0, 0x16AC9}, {0x16B50, 0x16B59}, {0x16B5B, 0x16B61},
    {0x16E80, 0x16E96}, {0x1D2E0, 0x1D2F3}, {0x1D360, 0x1D378}, {0x1D7CE, 0x1D7FF}, {0x1E140, 0x1E149},
    {0x1E2F0, 0x1E2F9}, {0x1E8C7, 0x1E8CF}, {0x1E950, 0x1E959}, {0x1EC71, 0x1ECAB}, {0x1ECAD, 0x1ECAF},
    {0x1ECB1, 0x1ECB4}, {0x1ED01, 0x1ED2D}, {0x1ED2F, 0x1ED3D}, {0x1F100, 0x1F10C}, {0x1FBF0, 0x1FBF9},
};
// clang-format on

bool InRanges(const CpRange* begin, const CpRange* end, uint32_t cp) {
  const CpRange* it = std::upper_bound(begin, end, cp, [](uint32_t c, const CpRange& r) { return c < r.first; });
  return it != begin && cp <= (it - 1)->last;
}

// The classes the GPT-2 pre-tokenizer distinguishes; kEnd lies past the text.
enum class CpClass : uint8_t { kEnd, kLetter, kNumber, kSpace, kOther };

CpClass Classify(uint32_t cp) {
  // Unicode White_Space, as llama.cpp's is_whitespace.
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
      (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000) {
    return CpClass::kSpace;
  }
  if (InRanges(std::begin(kLetters), std::end(kLetters), cp)) return CpClass::kLetter;
  if (InRanges(std::begin(kNumbers), std::end(kNumbers), cp)) return CpClass::kNumber;
  return CpClass::kOther;
}

// Splits `text` as the GPT-2 pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// does, following llama.cpp's hand-written matcher for it
// (unicode_regex_split_custom_gpt2). Returns byte ranges of `text`.
std::vector<std::string_view> SplitGpt2(std::string_view text) {
  struct Cp {
    uint32_t cp;
    CpClass cls;
    size_t off;
  };
  std::vector<Cp> cps;
  cps.reserve(text.size());
  for (size_t i = 0, len = 0; i < text.size(); i += len) {
    uint32_t cp = DecodeUtf8(text, i, &len);
    cps.push_back({cp, Classify(cp), i});
  }
  const size_t n = cps.size();
  constexpr uint32_t kNone = 0xFFFFFFFF;
  auto cpt = [&](size_t p) { return p < n ? cps[p].cp : kNone; };
  auto cls = [&](size_t p) { return p < n ? cps[p].cls : CpClass::kEnd; };
  auto off = [&](size_t p) { return p < n ? cps[p].off : text.size(); };

  std::vector<std::string_view> words;
  size_t prev_end = 0;
  auto add = [&](size_t end) {  // emits codepoints [prev_end, end)
    size_t len = end - prev_end;
    if (len > 0) words.push_back(text.substr(off(prev_end), off(end) - off(prev_end)));
    prev_end = end;
    return len;
  };
  for (size_t pos = 0; pos < n;) {
    const uint32_t c = cpt(pos);
    if (c == '\'' && pos + 1 < n) {  // 's|'t|'re|'ve|'m|'ll|'d
      uint32_t c1 = cpt(pos + 1);
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        pos += add(pos + 2);
        continue;
      }
      if (pos + 2 < n) {
        uint32_t c2 = cpt(pos + 2);
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
          pos += add(pos + 3);
          continue;
        }
      }
    }
    CpClass f = c == ' ' ? cls(pos + 1) : cls(pos);
    if (f == CpClass::kLetter || f == CpClass::kNumber || f == CpClass::kOther) {  // ' ?' then a run of one class
      const CpClass run = f;
      pos += (c == ' ');
      while (f == run) f = cls(++pos);
      add(pos);
      continue;
    }
    size_t spaces = 0;
    while (cls(pos + spaces) == CpClass::kSpace) ++spaces;
    if (spaces > 1 && cpt(pos + spaces) != kNone) {  // \s+(?!\S): leave the last space to the next word
      pos += spaces - 1;
      add(pos);
      continue;
    }
    if (spaces > 0) {  // \s+
      pos += spaces;
      add(pos);
      continue;
    }
    add(++pos);
  }
  return words;
}

// GPT-2's bytes-to-unicode table: printable bytes map to themselves, the
// others to U+0100 upwards, so every byte is one visible character.
struct ByteAlphabet {
  std::string encode[256];
  std::unordered_map<uint32_t, uint8_t> decode;
  ByteAlphabet() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? b : next++;
      AppendUtf8(cp, &encode[b]);
      decode[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteAlphabet& Bytes() {
  static const ByteAlphabet* const kAlphabet = new ByteAlphabet();
  return *kAlphabet;
}

// "<0x41>" -> 0x41; -1 when `s` is not of that form.
int ParseByteToken(std::string_view s) {
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (s.size() != 6 || !s.starts_with("<0x") || s[5] != '>' || hex(s[3]) < 0 || hex(s[4]) < 0) return -1;
  return hex(s[3]) * 16 + hex(s[4]);
}

// The "smollm" pre-tokenizer (llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM, shared with starcoder and
// refact): the pattern \p{N} first, so every digit is a word of its own, then the GPT-2 pattern
// over each piece between digits. llama.cpp applies its patterns in turn to the pieces the
// previous one left, keeping unmatched text as pieces too (unicode_regex_split).
std::vector<std::string_view> SplitSmollm(std::string_view text) {
  std::vector<std::string_view> words;
  size_t start = 0;  // of the current piece without digits
  for (size_t i = 0, len = 0; i < text.size(); i += len) {
    const uint32_t cp = DecodeUtf8(text, i, &len);
    if (Classify(cp) != CpClass::kNumber) continue;
    for (std::string_view w : SplitGpt2(text.substr(start, i - start))) words.push_back(w);
    words.push_back(text.substr(i, len));
    start = i + len;
  }
  for (std::string_view w : SplitGpt2(text.substr(start))) words.push_back(w);
  return words;
}

// ---- The tokenizer ------------------------------------------------------

class GgufTokenizer final : public Tokenizer {
 public:
  enum class Kind { kSpm, kGpt2 };
  enum class Pre { kGpt2, kSmollm };  // tokenizer.ggml.pre of a gpt2 vocabulary

  GgufTokenizer() = default;
  GgufTokenizer(const GgufTokenizer&) = delete;  // ids_ holds views into tokens_
  GgufTokenizer& operator=(const GgufTokenizer&) = delete;

  Status Load(const GgufFile& f);

  Result<std::vector<int>> Encode(std::string_view text, bool bos) const override {
    return EncodeImpl(text, bos, /*parse_special=*/false);
  }
  Result<std::vector<int>> EncodeSpecial(std::string_view text, bool bos) const override {
    return EncodeImpl(text, bos, /*parse_special=*/true);
  }
  std::string Decode(int prev, int token) const override;
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }
  int vocab_size() const override { return static_cast<int>(tokens_.size()); }
  bool add_bos() const override { return add_bos_; }
  bool IsEndOfGeneration(int token) const override {
    return token == eos_ || std::find(eog_.begin(), eog_.end(), token) != eog_.end();
  }
  int SpecialTokenId(std::string_view text) const override {
    const int id = Find(text);
    return id >= 0 && (types_[id] == kControl || types_[id] == kUserDefined) ? id : -1;
  }

 private:
  int Find(std::string_view piece) const {
    auto it = ids_.find(piece);
    return it == ids_.end() ? -1 : it->second;
  }
  // Rank of merging `left` and `right`; -1 when they do not merge.
  int Rank(std::string_view left, std::string_view right) const;
  static std::string RankKey(std::string_view left, std::string_view right);
  Result<std::vector<int>> EncodeImpl(std::string_view text, bool bos, bool parse_special) const;
  // A piece of the text to encode: raw text (token < 0) or a special token.
  struct Fragment {
    size_t offset, length;
    int token;
  };
  // llama.cpp's tokenizer_st_partition: splits `text` at every occurrence of
  // a special token's text, longest tokens first; user-defined tokens always,
  // control and unknown ones only when `parse_special`.
  std::vector<Fragment> Partition(std::string_view text, bool parse_special) const;
  Status EncodeSpm(std::string_view text, bool space_prefix, std::vector<int>* out) const;
  void EncodeGpt2(std::string_view text, std::vector<int>* out) const;

  Kind kind_ = Kind::kSpm;
  std::vector<std::string> tokens_;
  std::vector<std::string> pieces_;  // Decode's text of each token
  std::vector<float> scores_;
  std::vector<int32_t> types_;    // tokenizer.ggml.token_type
  std::vector<int> specials_;     // control, user-defined and unknown ids, longest text first
  std::vector<int> eog_;          // end-of-generation ids besides EOS (eot/eom keys)
  bool add_bos_ = false;
  std::unordered_map<std::string_view, int> ids_;  // views into tokens_; the last duplicate wins, as llama.cpp
  std::unordered_map<std::string, int> ranks_;     // RankKey -> merge rank (gpt2)
  int byte_tokens_[256];                           // spm byte fallback; -1 when absent
  int bos_ = 0, eos_ = 0;
  bool add_space_prefix_ = true;
  Pre pre_ = Pre::kGpt2;
};

Status GgufTokenizer::Load(const GgufFile& f) {
  FLATKV_ASSIGN_OR_RETURN(std::string_view model, f.GetString("tokenizer.ggml.model"));
  if (model == "llama") {
    kind_ = Kind::kSpm;
  } else if (model == "gpt2") {
    kind_ = Kind::kGpt2;
    if (f.FindKey("tokenizer.ggml.pre") != nullptr) {
      FLATKV_ASSIGN_OR_RETURN(std::string_view pre, f.GetString("tokenizer.ggml.pre"));
      if (pre == "gpt-2") {
        pre_ = Pre::kGpt2;
      } else if (pre == "smollm") {
        pre_ = Pre::kSmollm;
      } else {
        return Status::NotSupported("tokenizer.ggml.pre '" + std::string(pre) +
                                    "' is not supported (only 'gpt-2' and 'smollm')");
      }
    }
  } else {
    return Status::NotSupported("tokenizer.ggml.model '" + std::string(model) +
                                "' is not supported (only 'llama' and 'gpt2')");
  }
  FLATKV_ASSIGN_OR_RETURN(std::vector<std::string_view> tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  const uint64_t n = tokens.size();
  if (n == 0 || n > static_cast<uint64_t>(INT_MAX)) {
    return Status::Corruption("tokenizer.ggml.tokens: " + Num(n) + " tokens is out of range");
  }
  std::vector<int32_t> types(n, kNormal);
  if (f.FindKey("tokenizer.ggml.token_type") != nullptr) {
    FLATKV_ASSIGN_OR_RETURN(types, f.GetI32Array("tokenizer.ggml.token_type"));
  }
  scores_.assign(n, 0.0f);
  if (f.FindKey("tokenizer.ggml.scores") != nullptr) {
    FLATKV_ASSIGN_OR_RETURN(scores_, f.GetF32Array("tokenizer.ggml.scores"));
  }
  if (types.size() != n || scores_.size() != n) {
    return Status::Corruption("tokenizer: " + Num(n) + " tokens but " + Num(types.size()) + " token types and " +
                              Num(scores_.size()) + " scores");
  }
  const bool spm = kind_ == Kind::kSpm;
  const uint32_t no_id = UINT32_MAX;
  uint32_t bos = 0, eos = 0;
  FLATKV_ASSIGN_OR_RETURN(bos, f.GetU32("tokenizer.ggml.bos_token_id", spm ? 1 : no_id));
  FLATKV_ASSIGN_OR_RETURN(eos, f.GetU32("tokenizer.ggml.eos_token_id", spm ? 2 : no_id));
  if (bos >= n || eos >= n) {
    return Status::Corruption("tokenizer.ggml.bos_token_id " + (bos == no_id ? "(absent)" : Num(bos)) +
                              " or eos_token_id " + (eos == no_id ? "(absent)" : Num(eos)) + " is not below " + Num(n) +
                              " tokens");
  }
  bos_ = static_cast<int>(bos);
  eos_ = static_cast<int>(eos);
  FLATKV_ASSIGN_OR_RETURN(add_space_prefix_, f.GetBool("tokenizer.ggml.add_space_prefix", true));
  // llama.cpp's defaults: BOS in front for SentencePiece vocabularies, none for BPE.
  FLATKV_ASSIGN_OR_RETURN(add_bos_, f.GetBool("tokenizer.ggml.add_bos_token", spm));
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (f.FindKey(key) == nullptr) continue;
    FLATKV_ASSIGN_OR_RETURN(uint32_t id, f.GetU32(key));
    if (id >= n) return Status::Corruption(std::string(key) + " " + Num(id) + " is not below " + Num(n) + " tokens");
    eog_.push_back(static_cast<int>(id));
  }
  types_ = types;
  for (size_t i = 0; i < n; ++i) {
    if (types[i] == kControl || types[i] == kUserDefined || types[i] == kUnknown) {
      if (!tokens[i].empty()) specials_.push_back(static_cast<int>(i));
    }
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [&](int a, int b) { return tokens[a].size() > tokens[b].size(); });

  tokens_.assign(tokens.begin(), tokens.end());
  pieces_.resize(n);
  ids_.reserve(n);
  std::fill(std::begin(byte_tokens_), std::end(byte_tokens_), -1);
  const ByteAlphabet& alphabet = Bytes();
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = tokens_[i];
    ids_[t] = static_cast<int>(i);
    std::string& piece = pieces_[i];
    switch (types[i]) {
      case kByte: {
        int b = ParseByteToken(t);
        if (b < 0)
          return Status::Corruption("tokenizer.ggml.tokens: byte token " + Num(i) + " is '" + t + "', not <0xHH>");
        piece = std::string(1, static_cast<char>(b));
        if (byte_tokens_[b] < 0) byte_tokens_[b] = static_cast<int>(i);
        break;
      }
      case kControl:
      case kUnused:
        break;  // decodes to nothing
      case kUnknown:
        piece = spm ? "\xE2\x96\x85" : t;
        break;  // llama.cpp shows U+2585
      case kUserDefined:
        piece = t;
        break;
      default:  // normal (and undefined types)
        if (spm) {
          for (size_t k = 0; k < t.size();) {
            if (std::string_view(t).substr(k, 3) == kSpmSpace) {
              piece += ' ';
              k += 3;
            } else {
              piece += t[k++];
            }
          }
        } else {
          for (size_t k = 0, len = 0; k < t.size(); k += len) {
            uint32_t cp = DecodeUtf8(t, k, &len);
            auto it = alphabet.decode.find(cp);
            if (it != alphabet.decode.end()) {
              piece += static_cast<char>(it->second);
            } else {
              piece.append(t, k, len);
            }
          }
        }
    }
  }
  if (spm) {
    // Byte fallback: <0xHH>, else a single-byte piece, as llama.cpp's byte_to_token.
    for (int b = 0; b < 256; ++b) {
      if (byte_tokens_[b] < 0) byte_tokens_[b] = Find(std::string(1, static_cast<char>(b)));
    }
    return Status::Ok();
  }
  FLATKV_ASSIGN_OR_RETURN(std::vector<std::string_view> merges, f.GetStringArray("tokenizer.ggml.merges"));
  if (merges.size() > static_cast<uint64_t>(INT_MAX)) {
    return Status::Corruption("tokenizer.ggml.merges: " + Num(merges.size()) + " merges is out of range");
  }
  ranks_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    size_t sp = merges[i].find(' ', 1);
    if (sp == std::string_view::npos) {
      return Status::Corruption("tokenizer.ggml.merges: element " + Num(i) + " '" + std::string(merges[i]) +
                                "' is not two pieces separated by a space");
    }
    ranks_.emplace(RankKey(merges[i].substr(0, sp), merges[i].substr(sp + 1)), static_cast<int>(i));
  }
  return Status::Ok();
}

std::string GgufTokenizer::RankKey(std::string_view left, std::string_view right) {
  uint32_t len = static_cast<uint32_t>(left.size());
  std::string key(reinterpret_cast<const char*>(&len), sizeof(len));
  key.append(left);
  key.append(right);
  return key;
}

int GgufTokenizer::Rank(std::string_view left, std::string_view right) const {
  auto it = ranks_.find(RankKey(left, right));
  return it == ranks_.end() ? -1 : it->second;
}

std::vector<GgufTokenizer::Fragment> GgufTokenizer::Partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> frags = {{0, text.size(), -1}};
  for (int id : specials_) {
    if (!parse_special && types_[id] != kUserDefined) continue;
    const std::string& sp = tokens_[id];
    std::vector<Fragment> next;
    next.reserve(frags.size());
    for (const Fragment& fr : frags) {
      if (fr.token >= 0) {
        next.push_back(fr);
        continue;
      }
      size_t at = fr.offset;
      const size_t end = fr.offset + fr.length;
      for (;;) {
        const size_t hit = text.substr(0, end).find(sp, at);
        if (hit == std::string_view::npos) break;
        if (hit > at) next.push_back({at, hit - at, -1});
        next.push_back({hit, sp.size(), id});
        at = hit + sp.size();
      }
      if (at < end) next.push_back({at, end - at, -1});
    }
    frags = std::move(next);
  }
  return frags;
}

Result<std::vector<int>> GgufTokenizer::EncodeImpl(std::string_view text, bool bos, bool parse_special) const {
  std::vector<int> out;
  if (bos) out.push_back(bos_);
  if (text.empty()) return out;
  // As llama.cpp's tokenize: each raw fragment on its own; a SentencePiece
  // fragment gets the space prefix when it opens the text or follows a
  // special token.
  bool prev_special = true;
  for (const Fragment& fr : Partition(text, parse_special)) {
    if (fr.token >= 0) {
      out.push_back(fr.token);
      prev_special = true;
      continue;
    }
    const std::string_view piece = text.substr(fr.offset, fr.length);
    if (kind_ == Kind::kSpm) {
      FLATKV_RETURN_IF_ERROR(EncodeSpm(piece, add_space_prefix_ && prev_special, &out));
    } else {
      EncodeGpt2(piece, &out);
    }
    prev_special = false;
  }
  return out;
}

// A piece of the text being merged: a doubly linked list over a vector.
struct Symbol {
  int prev, next;
  size_t start, n;  // bytes of the working string; n == 0 once merged away
};

// Splits `s` into UTF-8 characters (a truncated last one kept as is).
std::vector<Symbol> SplitChars(std::string_view s) {
  std::vector<Symbol> syms;
  for (size_t off = 0; off < s.size();) {
    size_t len = std::min(Utf8Len(static_cast<unsigned char>(s[off])), s.size() - off);
    int idx = static_cast<int>(syms.size());
    syms.push_back({idx - 1, off + len == s.size() ? -1 : idx + 1, off, len});
    off += len;
  }
  return syms;
}

// Merges right into left.
void MergeSymbols(std::vector<Symbol>& syms, int left, int right) {
  syms[left].n += syms[right].n;
  syms[right].n = 0;
  syms[left].next = syms[right].next;
  if (syms[right].next >= 0) syms[syms[right].next].prev = left;
}

Status GgufTokenizer::EncodeSpm(std::string_view text, bool space_prefix, std::vector<int>* out) const {
  std::string s;
  s.reserve(text.size() + kSpmSpace.size());
  if (space_prefix) s += kSpmSpace;
  for (char c : text) {
    if (c == ' ') {
      s += kSpmSpace;
    } else {
      s += c;
    }
  }
  std::vector<Symbol> syms = SplitChars(s);
  struct Bigram {
    int left, right;
    float score;
    size_t size;
  };
  // Highest score first; ties go to the leftmost pair.
  auto lower = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(lower)> queue(lower);
  auto try_add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    int id = Find(std::string_view(s).substr(syms[l].start, syms[l].n + syms[r].n));
    if (id >= 0) queue.push({l, r, scores_[id], syms[l].n + syms[r].n});
  };
  for (int i = 1; i < static_cast<int>(syms.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    Bigram b = queue.top();
    queue.pop();
    Symbol& l = syms[b.left];
    Symbol& r = syms[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
    MergeSymbols(syms, b.left, b.right);
    try_add(syms[b.left].prev, b.left);
    try_add(b.left, syms[b.left].next);
  }
  // Every merged symbol is a vocabulary piece; a character that never merged
  // and is not a piece falls back to byte tokens. (llama.cpp's resegment()
  // also consults its rev_merge map here, which cannot match: it only holds
  // pieces that are in the vocabulary.)
  for (int i = syms.empty() ? -1 : 0; i != -1; i = syms[i].next) {
    std::string_view piece = std::string_view(s).substr(syms[i].start, syms[i].n);
    int id = Find(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (unsigned char c : piece) {
      if (byte_tokens_[c] < 0) {
        static constexpr char kHex[] = "0123456789ABCDEF";
        return Status::InvalidArgument(std::string("tokenizer: no token for byte 0x") + kHex[c >> 4] + kHex[c & 15] +
                                       " (the vocabulary has no byte fallback for it)");
      }
      out->push_back(byte_tokens_[c]);
    }
  }
  return Status::Ok();
}

void GgufTokenizer::EncodeGpt2(std::string_view text, std::vector<int>* out) const {
  const ByteAlphabet& alphabet = Bytes();
  struct Bigram {
    int left, right;
    int rank;
    size_t size;
  };
  // Lowest rank first; ties go to the leftmost pair.
  auto later = [](const Bigram& a, const Bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  for (std::string_view word : pre_ == Pre::kSmollm ? SplitSmollm(text) : SplitGpt2(text)) {
    std::string s;
    for (unsigned char c : word) s += alphabet.encode[c];
    std::vector<Symbol> syms = SplitChars(s);
    std::priority_queue<Bigram, std::vector<Bigram>, decltype(later)> queue(later);
    auto text_of = [&](int i) { return std::string_view(s).substr(syms[i].start, syms[i].n); };
    auto try_add = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      int rank = Rank(text_of(l), text_of(r));
      if (rank >= 0) queue.push({l, r, rank, syms[l].n + syms[r].n});
    };
    for (int i = 1; i < static_cast<int>(syms.size()); ++i) try_add(i - 1, i);
    while (!queue.empty()) {
      Bigram b = queue.top();
      queue.pop();
      const Symbol& l = syms[b.left];
      const Symbol& r = syms[b.right];
      // Stale unless both are alive, still adjacent and unchanged (llama.cpp
      // compares the text, which amounts to the same).
      if (l.n == 0 || r.n == 0 || l.next != b.right || l.n + r.n != b.size) continue;
      MergeSymbols(syms, b.left, b.right);
      try_add(syms[b.left].prev, b.left);
      try_add(b.left, syms[b.left].next);
    }
    for (int i = syms.empty() ? -1 : 0; i != -1; i = syms[i].next) {
      std::string_view piece = text_of(i);
      int id = Find(piece);
      if (id >= 0) {
        out->push_back(id);
        continue;
      }
      for (char c : piece) {  // as llama.cpp: single bytes that are tokens, others dropped
        int b = Find(std::string_view(&c, 1));
        if (b >= 0) out->push_back(b);
      }
    }
  }
}

std::string GgufTokenizer::Decode(int prev, int token) const {
  if (token < 0 || token >= vocab_size()) return "";
  const std::string& piece = pieces_[token];
  if (kind_ == Kind::kSpm && prev == bos_ && !piece.empty() && piece[0] == ' ') return piece.substr(1);
  return piece;
}

}  // namespace

Result<std::shared_ptr<const Tokenizer>> LoadGgufTokenizer(const GgufFile& file) {
  auto t = std::make_shared<GgufTokenizer>();
  FLATKV_RETURN_IF_ERROR(t->Load(file));
  return std::shared_ptr<const Tokenizer>(std::move(t));
}

}  // namespace flatkv::model
