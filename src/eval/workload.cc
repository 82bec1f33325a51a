#include "eval/workload.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "model/chat.h"

namespace flatkv::eval {
namespace {

constexpr const char* kProseSuffix = "#text";
constexpr const char* kDebianPackages = "libpython3.11-minimal and libpython3.11-stdlib (Debian 12)";

std::vector<std::string> SplitOn(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    out.emplace_back(s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

// The contents of the string literals on each line of a file like
// pydoc_data/topics.py, keys (a literal followed by ':') left out.
std::string StringLiteralText(std::string_view py) {
  std::string out;
  size_t i = 0;
  while (i < py.size()) {
    const char q = py[i];
    if (q != '\'' && q != '"') {
      if (q == '#') {  // comment to the end of the line
        while (i < py.size() && py[i] != '\n') ++i;
      }
      ++i;
      continue;
    }
    std::string lit;
    size_t j = i + 1;
    for (; j < py.size() && py[j] != q && py[j] != '\n'; ++j) {
      if (py[j] == '\\' && j + 1 < py.size()) {
        const char e = py[++j];
        lit += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      } else {
        lit += py[j];
      }
    }
    i = j + 1;
    size_t k = i;
    while (k < py.size() && py[k] == ' ') ++k;
    if (k < py.size() && py[k] == ':') continue;  // a dict key
    out += lit;
  }
  return out;
}

uint32_t PassKey(const std::string& id) { return 10000 + uint32_t(XXH3_64bits(id.data(), id.size()) % 90000); }

class Builder {
 public:
  Builder(const model::Model& m, const WorkloadOptions& o) : m_(m), o_(o) {}

  Status LoadSums() {
    const std::string path = o_.sha256_path.empty() ? o_.data_dir + "/realtext.sha256" : o_.sha256_path;
    FLATKV_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(path));
    for (const std::string& line : SplitOn(text, '\n')) {
      if (line.empty() || line[0] == '#') continue;
      const size_t sp = line.find("  ");
      if (sp != 64) return Status::InvalidArgument(path + ": not a sha256sum line: '" + line + "'");
      sums_[line.substr(66)] = line.substr(0, 64);
    }
    return Status::Ok();
  }

  // The tokens of `source` ("path" or "path#text"), checked and cached.
  Result<const std::vector<int>*> Tokens(const std::string& source, const std::string& header = "") {
    const std::string key = header + "\n" + source;
    if (auto it = cache_.find(key); it != cache_.end()) return &it->second;
    const bool prose = source.size() > 5 && source.ends_with(kProseSuffix);
    const std::string rel = prose ? source.substr(0, source.size() - 5) : source;
    auto sum = sums_.find(rel);
    if (sum == sums_.end())
      return Status::InvalidArgument("workload source " + rel + " is not in realtext.sha256 (add it with its SHA-256)");
    const std::string path = o_.root + "/" + rel;
    auto bytes = ReadWholeFile(path);
    if (!bytes.ok())
      return Status::NotFound("workload source " + path + " cannot be read (" + bytes.status().ToString() +
                              "); it comes from " + kDebianPackages);
    const std::string got = Sha256Hex(*bytes);
    if (got != sum->second)
      return Status::Corruption("workload source " + path + " has SHA-256 " + got + ", realtext.sha256 expects " +
                                sum->second + " (" + kDebianPackages + " of another version?)");
    const std::string text = header + (prose ? StringLiteralText(*bytes) : *bytes);
    FLATKV_ASSIGN_OR_RETURN(std::vector<int> toks, m_.tokenizer->Encode(text, false));
    return &cache_.emplace(key, std::move(toks)).first->second;
  }

  Result<Prompt> Build(const PromptSpec& s) {
    Prompt p;
    p.id = s.id;
    p.kind = s.kind;
    p.genre = s.sources[0].find(kProseSuffix) != std::string::npos ? "prose" : "code";
    const uint32_t cont = o_.continuation_tokens;
    auto too_short = [&](const std::string& src, size_t have, size_t need) {
      return Status::InvalidArgument("workload prompt " + s.id + ": source " + src + " gives " + std::to_string(have) +
                                     " tokens, the prompt needs " + std::to_string(need));
    };
    if (s.kind == PromptKind::kLong) {
      std::string src = s.sources[0];
      uint64_t offset = 0;
      if (const size_t at = src.find('@'); at != std::string::npos) {
        offset = std::stoull(src.substr(at + 1));
        src.resize(at);
      }
      FLATKV_ASSIGN_OR_RETURN(const std::vector<int>* t, Tokens(src));
      if (t->size() < offset + s.context + cont) return too_short(src, t->size(), offset + s.context + cont);
      p.context.assign(t->begin() + offset, t->begin() + offset + s.context);
      p.continuation.assign(t->begin() + offset + s.context, t->begin() + offset + s.context + cont);
      p.docs = {p.context};
    } else if (s.kind == PromptKind::kMultiDoc) {
      for (size_t i = 0; i < s.sources.size(); ++i) {
        FLATKV_ASSIGN_OR_RETURN(const std::vector<int>* t, Tokens(s.sources[i], "# file: " + s.sources[i] + "\n"));
        const bool last = i + 1 == s.sources.size();
        if (!last) {
          p.docs.push_back(*t);
          p.context.insert(p.context.end(), t->begin(), t->end());
          continue;
        }
        if (p.context.size() + 64 > s.context)
          return Status::InvalidArgument("workload prompt " + s.id + ": the documents before " + s.sources[i] +
                                         " already take " + std::to_string(p.context.size()) +
                                         " tokens of its context of " + std::to_string(s.context));
        const size_t take = s.context - p.context.size();
        if (t->size() < take + cont) return too_short(s.sources[i], t->size(), take + cont);
        p.docs.emplace_back(t->begin(), t->begin() + take);
        p.context.insert(p.context.end(), t->begin(), t->begin() + take);
        p.continuation.assign(t->begin() + take, t->begin() + take + cont);
      }
    } else {
      FLATKV_ASSIGN_OR_RETURN(const model::ChatMl chat, model::ParseChatMlTemplate(m_.chat_template));
      const uint32_t key = PassKey(s.id);
      p.answer = std::to_string(key);
      FLATKV_ASSIGN_OR_RETURN(
          std::vector<int> head,
          m_.tokenizer->EncodeSpecial("<|im_start|>system\n" + chat.system +
                                          "<|im_end|>\n<|im_start|>user\nThere is an important pass key hidden "
                                          "inside a lot of irrelevant text. Find it and memorize it. I will quiz "
                                          "you about the pass key.\n\n",
                                      m_.tokenizer->add_bos()));
      FLATKV_ASSIGN_OR_RETURN(std::vector<int> needle,
                              m_.tokenizer->Encode("\nThe pass key is " + p.answer + ". Remember it. " + p.answer +
                                                       " is the pass key.\n",
                                                   false));
      FLATKV_ASSIGN_OR_RETURN(p.question, m_.tokenizer->EncodeSpecial(
                                              "\n\nWhat is the pass key?<|im_end|>\n<|im_start|>assistant\nThe pass key is",
                                              false));
      FLATKV_ASSIGN_OR_RETURN(const std::vector<int>* filler, Tokens(s.sources[0]));
      if (s.context < head.size() + needle.size() + 64)
        return Status::InvalidArgument("workload prompt " + s.id + ": context " + std::to_string(s.context) +
                                       " is too short for the pass key prompt");
      const size_t fill = s.context - head.size() - needle.size();
      if (filler->size() < fill) return too_short(s.sources[0], filler->size(), fill);
      // The needle goes after the first line break at or past depth x fill.
      size_t at = size_t(std::llround(s.depth * double(fill)));
      const std::vector<int>& f = *filler;
      while (at > 0 && at < fill && m_.tokenizer->Decode(at >= 2 ? f[at - 2] : -1, f[at - 1]).find('\n') == std::string::npos)
        ++at;
      p.context = head;
      p.context.insert(p.context.end(), filler->begin(), filler->begin() + at);
      p.context.insert(p.context.end(), needle.begin(), needle.end());
      p.context.insert(p.context.end(), filler->begin() + at, filler->begin() + fill);
      p.docs = {p.context};
    }
    return p;
  }

 private:
  const model::Model& m_;
  const WorkloadOptions& o_;
  std::map<std::string, std::string> sums_;
  std::map<std::string, std::vector<int>> cache_;
};

}  // namespace

Result<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::FromErrno(errno, "open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return Status::IoError("read " + path);
  return s.str();
}

const char* PromptKindName(PromptKind kind) {
  switch (kind) {
    case PromptKind::kLong: return "long";
    case PromptKind::kMultiDoc: return "multidoc";
    case PromptKind::kRetrieval: return "retrieval";
  }
  return "?";
}

std::string Sha256Hex(std::string_view bytes) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_Digest(bytes.data(), bytes.size(), d, &n, EVP_sha256(), nullptr);
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out += digits[d[i] >> 4];
    out += digits[d[i] & 15];
  }
  return out;
}

Result<std::vector<PromptSpec>> ParseWorkloadList(std::string_view text) {
  std::vector<PromptSpec> out;
  int line_no = 0;
  for (const std::string& line : SplitOn(text, '\n')) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    const auto f = SplitOn(line, '\t');
    const std::string where = "realtext.tsv line " + std::to_string(line_no);
    if (f.size() < 4) return Status::InvalidArgument(where + ": want id, kind, context, sources[, options] tab-separated");
    PromptSpec s;
    s.id = f[0];
    if (s.id.empty()) return Status::InvalidArgument(where + ": empty id");
    for (const PromptSpec& o : out)
      if (o.id == s.id) return Status::InvalidArgument(where + ": id " + s.id + " repeats");
    if (f[1] == "long") s.kind = PromptKind::kLong;
    else if (f[1] == "multidoc") s.kind = PromptKind::kMultiDoc;
    else if (f[1] == "retrieval") s.kind = PromptKind::kRetrieval;
    else return Status::InvalidArgument(where + ": kind '" + f[1] + "' (want long, multidoc or retrieval)");
    char* end = nullptr;
    const unsigned long ctx = std::strtoul(f[2].c_str(), &end, 10);
    if (f[2].empty() || *end != '\0' || ctx < 64 || ctx > 8192)
      return Status::InvalidArgument(where + ": context '" + f[2] + "' (want 64..8192 tokens)");
    s.context = uint32_t(ctx);
    for (const std::string& src : SplitOn(f[3], ' '))
      if (!src.empty()) s.sources.push_back(src);
    if (s.sources.empty()) return Status::InvalidArgument(where + ": no sources");
    if (s.kind != PromptKind::kMultiDoc && s.sources.size() != 1)
      return Status::InvalidArgument(where + ": a " + f[1] + " prompt has exactly one source");
    if (s.kind == PromptKind::kMultiDoc && s.sources.size() < 2)
      return Status::InvalidArgument(where + ": a multidoc prompt has at least two sources");
    for (const std::string& src : s.sources)
      if (src.find('@') != std::string::npos && s.kind != PromptKind::kLong)
        return Status::InvalidArgument(where + ": '@offset' is for long prompts only (" + src + ")");
    if (s.kind == PromptKind::kRetrieval) {
      const std::string opt = f.size() > 4 ? f[4] : "";
      if (!opt.starts_with("depth="))
        return Status::InvalidArgument(where + ": a retrieval prompt needs depth=F (0..1) in its options column");
      s.depth = std::strtod(opt.c_str() + 6, &end);
      if (*end != '\0' || !(s.depth >= 0 && s.depth <= 1))
        return Status::InvalidArgument(where + ": depth '" + opt.substr(6) + "' (want 0..1)");
    }
    out.push_back(std::move(s));
  }
  return out;
}

Result<std::vector<Prompt>> BuildWorkload(const model::Model& model, const WorkloadOptions& options) {
  if (!model.tokenizer) return Status::InvalidArgument("workload: model " + model.source + " has no tokenizer");
  if (options.data_dir.empty() && (options.list_path.empty() || options.sha256_path.empty()))
    return Status::InvalidArgument("workload: no data_dir (the directory of realtext.tsv and realtext.sha256)");
  const std::string list = options.list_path.empty() ? options.data_dir + "/realtext.tsv" : options.list_path;
  FLATKV_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(list));
  FLATKV_ASSIGN_OR_RETURN(const std::vector<PromptSpec> specs, ParseWorkloadList(text));
  for (const std::string& k : options.kinds)
    if (k != "long" && k != "multidoc" && k != "retrieval")
      return Status::InvalidArgument("workload kind '" + k + "' (want long, multidoc or retrieval)");
  for (const std::string& id : options.ids) {
    auto spec = std::find_if(specs.begin(), specs.end(), [&](const PromptSpec& s) { return s.id == id; });
    if (spec == specs.end()) return Status::InvalidArgument("workload prompt id '" + id + "' is not in " + list);
    if (options.max_context > 0 && spec->context > options.max_context)  // named, so not silently dropped
      return Status::InvalidArgument("workload prompt id '" + id + "' has " + std::to_string(spec->context) +
                                     " context tokens, over the maximum of " + std::to_string(options.max_context) +
                                     " (--max-context)");
  }
  Builder b(model, options);
  FLATKV_RETURN_IF_ERROR(b.LoadSums());
  std::vector<Prompt> out;
  for (const PromptSpec& s : specs) {
    if (options.max_context > 0 && s.context > options.max_context) continue;
    if (!options.kinds.empty() &&
        std::find(options.kinds.begin(), options.kinds.end(), PromptKindName(s.kind)) == options.kinds.end())
      continue;
    if (!options.ids.empty() && std::find(options.ids.begin(), options.ids.end(), s.id) == options.ids.end()) continue;
    FLATKV_ASSIGN_OR_RETURN(Prompt p, b.Build(s));
    out.push_back(std::move(p));
  }
  return out;
}

nlohmann::json WorkloadJson(const model::Model& model, const std::vector<Prompt>& prompts) {
  nlohmann::json j = {{"version", 1}, {"model", model.source}, {"model_fingerprint", model.fingerprint}};
  j["prompts"] = nlohmann::json::array();
  for (const Prompt& p : prompts)
    j["prompts"].push_back({{"id", p.id},
                            {"kind", PromptKindName(p.kind)},
                            {"genre", p.genre},
                            {"context", p.context},
                            {"docs", p.docs},
                            {"continuation", p.continuation},
                            {"question", p.question},
                            {"answer", p.answer}});
  return j;
}

}  // namespace flatkv::eval
