#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "tokenizer/tokenizer_error.h"
#include "tokenizer/utf8.h"

namespace m40::tokenizer {

namespace {

// The regexes below come from the models' tokenizer.json files by way of
// llama.cpp's llm_tokenizer_bpe (which also rewrote `(?i:'s|...)` into
// explicit case classes). Two notes on how they are matched here:
// - `\s` is Unicode White_Space (U+0009..U+000D, U+0020, U+0085, U+00A0,
//   U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000), which
//   is what llama.cpp's tables and the HF tokenizers give; PCRE2's own `\s`
//   leaves out U+0085, so to_pcre2_pattern spells the class out.
// - deepseek-llm's `\s+$` is written `(?<!\s)\s+$`: the same matches (a
//   trailing run of spaces is matched from its first character either way),
//   but a long run of spaces that is not at the end costs linear instead of
//   quadratic time.
constexpr std::string_view kGpt2 = R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re";
constexpr std::string_view kLlama3 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr std::string_view kQwen2 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr std::string_view kQwen35 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr std::string_view kCjk = R"re([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)re";
constexpr std::string_view kDeepseekLlmLetters =
    R"re(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})re"
    R"re(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})re"
    R"re(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})re"
    R"re(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})re"
    R"re(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})re"
    R"re(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})re"
    R"re(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})re"
    R"re(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})re"
    R"re(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})re"
    R"re(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})re"
    R"re(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})re"
    R"re(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})re"
    R"re(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)re";
constexpr std::string_view kDeepseekLlmPunct = R"re(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)re";
constexpr std::string_view kDeepseekV3Main =
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr std::string_view kBloom = R"re( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+)re";
constexpr std::string_view kTekken =
    R"re([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr std::string_view kGpt4o =
    R"re([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr std::string_view kSeedCoder =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr std::string_view kBailingMoe =
    R"re('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)re";

std::vector<PreTokenizerFlavour> make_flavours() {
  std::vector<PreTokenizerFlavour> f;
  auto add = [&](std::string_view name, std::vector<std::string_view> gguf_names, std::vector<std::string_view> regexes) -> PreTokenizerFlavour& {
    PreTokenizerFlavour flavour;
    flavour.name = name;
    flavour.gguf_names = std::move(gguf_names);
    flavour.regexes = std::move(regexes);
    f.push_back(std::move(flavour));
    return f.back();
  };
  // Also what a BPE vocabulary without `tokenizer.ggml.pre` gets (llama.cpp
  // does the same, with a warning).
  add("default", {"default"}, {R"re([\p{P}\$\+<=>\^~\|]+)re", kGpt2, R"re(\p{N}+)re", "[0-9][0-9][0-9]"});
  {
    auto& l = add("llama3", {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}, {kLlama3});
    l.ignore_merges = true;
    l.add_bos = true;
  }
  add("dbrx", {"dbrx"}, {kLlama3});
  add("smaug", {"smaug-bpe"}, {kLlama3});
  add("deepseek-llm", {"deepseek-llm"},
      {R"re([\r\n])re", kDeepseekLlmLetters, kDeepseekLlmPunct, R"re((?<!\s)\s+$)re", kCjk, R"re(\p{N}+)re"})
      .clean_spaces = false;
  add("deepseek-coder", {"deepseek-coder"},
      {R"re([\r\n])re", R"re(\s?\p{L}+)re", R"re(\s?\p{P}+)re", kCjk, R"re(\p{N})re"})
      .clean_spaces = false;
  add("deepseek-v3", {"deepseek-v3", "hunyuan-dense", "joyai-llm"},
      {R"re(\p{N}{1,3})re", R"re([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)re", kDeepseekV3Main})
      .clean_spaces = false;
  add("falcon", {"falcon"}, {R"re([\p{P}\$\+<=>\^~\|`]+)re", kGpt2, "[0-9][0-9][0-9]"});
  add("starcoder", {"starcoder", "codeshell", "exaone", "minerva-7b", "mellum2"}, {R"re(\p{N})re", kGpt2});
  add("refact", {"refact"}, {R"re(\p{N})re", kGpt2});
  add("command-r", {"command-r", "smollm"}, {R"re(\p{N})re", kGpt2}).clean_spaces = false;
  add("gpt-2", {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
                "modern-bert", "exaone4", "jina-v1-en", "jina-v2-code", "roberta-bpe"},
      {kGpt2});
  add("mpt", {"mpt"}, {kGpt2});
  add("olmo", {"olmo", "jais"}, {kGpt2});
  add("trillion", {"trillion", "granite-docling"}, {kGpt2}).clean_spaces = false;
  add("qwen2", {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"}, {kQwen2}).clean_spaces = false;
  add("stablelm2", {"stablelm2", "megrez"}, {kQwen2});
  add("qwen35", {"qwen35"}, {kQwen35}).clean_spaces = false;
  add("poro", {"poro-chat"}, {kBloom}).clean_spaces = false;
  add("bloom", {"bloom", "gpt3-finnish"}, {kBloom});
  add("chatglm4", {"chatglm-bpe", "glm4"}, {kLlama3}).no_default_bos = true;
  add("viking", {"viking"}, {kBloom, R"re(\p{N})re"}).clean_spaces = false;
  {
    auto& t = add("tekken", {"tekken"}, {kTekken});
    t.clean_spaces = false;
    t.ignore_merges = true;
    t.add_bos = true;
  }
  {
    auto& c = add("chameleon", {"chameleon"},
                  {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", R"re(\p{N})re",
                   R"re([\p{P}!-/:-@\[-`{-~])re", kGpt2});
    c.clean_spaces = false;
    c.add_bos = true;
  }
  add("gpt-4o", {"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, {kGpt4o}).clean_spaces = false;
  add("seed-coder", {"seed-coder"}, {kSeedCoder}).clean_spaces = false;
  add("bailingmoe", {"bailingmoe", "bailingmoe2", "llada-moe"}, {kBailingMoe}).clean_spaces = false;
  add("grok-2", {"grok-2"}, {kQwen2}).clean_spaces = false;
  return f;
}

// Unicode White_Space, as the body of a character class.
constexpr std::string_view kWhiteSpaceClassBody =
    R"re(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})re";

// One thread's PCRE2 state: a match context with a JIT stack. Backtracking
// over a long word (tekken's lookahead groups take ~40 bytes of stack per
// character) can need more than the default 32 KiB: the stack starts at 1 MiB
// and grows eightfold, up to 1 GiB, each time PCRE2 runs out.
struct ThreadMatchState {
  static constexpr size_t kFirstStack = size_t{1} << 20;
  static constexpr size_t kLargestStack = size_t{1} << 30;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  size_t stack_size = 0;

  ThreadMatchState() {
    context = pcre2_match_context_create(nullptr);
    if (context == nullptr) throw TokenizerError("out of memory for a PCRE2 match context");
    // The default limit (10 million steps) stops e.g. `\s*[\r\n]+` on 16 MiB
    // of spaces; the table's regexes are linear, so no step limit.
    pcre2_set_match_limit(context, UINT32_MAX);
    set_stack(kFirstStack);
  }
  ~ThreadMatchState() {
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
  }
  ThreadMatchState(const ThreadMatchState&) = delete;
  ThreadMatchState& operator=(const ThreadMatchState&) = delete;

  bool set_stack(size_t size) {
    pcre2_jit_stack* bigger = pcre2_jit_stack_create(32 * 1024, size, nullptr);
    if (bigger == nullptr) return false;
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
    jit_stack = bigger;
    stack_size = size;
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
    return true;
  }
  // After PCRE2_ERROR_JIT_STACKLIMIT: whether a larger stack is in place.
  bool grow_stack() { return stack_size < kLargestStack && set_stack(stack_size * 8); }
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof buffer) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

const std::vector<PreTokenizerFlavour>& pre_tokenizer_flavours() {
  static const std::vector<PreTokenizerFlavour> flavours = make_flavours();
  return flavours;
}

const PreTokenizerFlavour* find_pre_tokenizer_flavour(std::string_view gguf_name) {
  for (const auto& flavour : pre_tokenizer_flavours()) {
    for (std::string_view n : flavour.gguf_names) {
      if (n == gguf_name) return &flavour;
    }
  }
  return nullptr;
}

std::string known_pre_tokenizer_names() {
  std::vector<std::string_view> names;
  for (const auto& flavour : pre_tokenizer_flavours()) {
    names.insert(names.end(), flavour.gguf_names.begin(), flavour.gguf_names.end());
  }
  std::sort(names.begin(), names.end());
  std::string s;
  for (std::string_view n : names) {
    if (!s.empty()) s += ", ";
    s += n;
  }
  return s;
}

std::string to_pcre2_pattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpaceClassBody;
        } else {
          out += '[';
          out += kWhiteSpaceClassBody;
          out += ']';
        }
      } else if (e == 'S') {
        if (in_class) throw TokenizerError("pre-tokenizer regex uses \\S inside a character class: " + std::string(pattern));
        out += "[^";
        out += kWhiteSpaceClassBody;
        out += ']';
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
    } else if (c == ']' && in_class) {
      in_class = false;
    }
    out += c;
  }
  return out;
}

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string source;
  ~Compiled() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

PreTokenizer::PreTokenizer(const PreTokenizerFlavour& flavour) : flavour_(&flavour) {
  for (std::string_view regex : flavour.regexes) {
    auto compiled = std::make_unique<Compiled>();
    compiled->source = to_pcre2_pattern(regex);
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    compiled->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled->source.data()), compiled->source.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &error, &error_offset, nullptr);
    if (compiled->code == nullptr) {
      throw TokenizerError("pre-tokenizer '" + std::string(flavour.name) + "': regex does not compile at offset " +
                           std::to_string(error_offset) + " (" + pcre2_error_text(error) + "): " + compiled->source);
    }
    // Without JIT (an unsupported CPU) PCRE2 interprets: slower, same result.
    compiled->jit = pcre2_jit_compile(compiled->code, PCRE2_JIT_COMPLETE) == 0;
    regexes_.push_back(std::move(compiled));
  }
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

void PreTokenizer::split(std::string_view text, std::vector<Span>& words) const {
  words.clear();
  if (text.empty()) return;
  words.push_back({0, static_cast<uint32_t>(text.size())});
  if (regexes_.empty()) return;

  ThreadMatchState& state = thread_match_state();
  std::vector<Span> next;
  for (const auto& regex : regexes_) {
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(regex->code, nullptr);
    if (match == nullptr) throw TokenizerError("out of memory for PCRE2 match data");
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
    next.clear();
    next.reserve(words.size() * 2);
    for (const Span piece : words) {
      // One character stays one piece whatever the regex does.
      if (piece.size() <= 4 && utf8::lead_length(static_cast<uint8_t>(text[piece.begin])) == piece.size()) {
        next.push_back(piece);
        continue;
      }
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece.begin);
      const size_t length = piece.size();
      size_t position = 0;    // where the next search starts
      size_t covered = 0;     // end of the last match
      uint32_t options = 0;   // after an empty match: try for a non-empty one right there
      auto push = [&](size_t b, size_t e) { next.push_back({piece.begin + uint32_t(b), piece.begin + uint32_t(e)}); };
      while (position <= length) {
        // The JIT entry point skips pcre2_match's checks (the text is known
        // valid UTF-8); it cannot anchor, which the rare retry after an
        // empty match needs.
        const int rc = regex->jit && options == 0
                           ? pcre2_jit_match(regex->code, subject, length, position, 0, match, state.context)
                           : pcre2_match(regex->code, subject, length, position, options | PCRE2_NO_UTF_CHECK, match,
                                         state.context);
        if (rc == PCRE2_ERROR_NOMATCH) {
          if (options == 0) break;
          // No non-empty match where the empty one was: move one character on.
          options = 0;
          if (position >= length) break;
          position += utf8::lead_length(static_cast<uint8_t>(text[piece.begin + position]));
          continue;
        }
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && state.grow_stack()) continue;  // the same match again
        if (rc < 0) {
          pcre2_match_data_free(match);
          throw TokenizerError("pre-tokenizer '" + std::string(flavour_->name) + "': PCRE2 gave up on a " +
                               std::to_string(length) + "-byte piece (" + pcre2_error_text(rc) + ")");
        }
        const size_t match_begin = ovector[0];
        const size_t match_end = ovector[1];
        if (match_begin > covered) push(covered, match_begin);
        if (match_end > match_begin) push(match_begin, match_end);
        covered = std::max(covered, match_end);
        position = match_end;
        if (match_end == match_begin) {
          if (position >= length) break;
          options = PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED;
        } else {
          options = 0;
        }
      }
      if (covered < length) push(covered, length);
    }
    pcre2_match_data_free(match);
    words.swap(next);
  }
}

}  // namespace m40::tokenizer
