// Tokenizer throughput: 1 MiB of English and 1 MiB of mixed-script text (and
// 1 MiB of random words),
// tokenized with an SPM and byte-level BPE vocabularies, then turned back
// into text (batch decode and the streaming detokenizer), in MB/s (10^6
// bytes of input text per second; best of several runs, one thread).
//
// The limit to compare against: llama.cpp tokenizes at tens of MB/s.
//
//   bench_tokenizer [--vocab-dir DIR] [--runs N] [--mib N] [--wall]
//
// Times are this thread's CPU time (--wall: the wall clock), best of N runs.
//
// English text: the license texts Debian installs in /usr/share/common-licenses
// (base-files), repeated to the size; mixed-script text: built-in paragraphs
// in a dozen scripts plus llama.cpp's tokenizer test strings, shuffled with a
// fixed seed; and, as a worst case for the word caches, words of random
// characters from a dozen scripts (fixed seed). The same bytes on every run.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/vocab.h"

namespace {

namespace fs = std::filesystem;
using m40::tokenizer::StreamingDetokenizer;
using m40::tokenizer::TokenId;
using m40::tokenizer::Vocab;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Written for this benchmark: ordinary prose in each script.
const char* const kParagraphs[] = {
    "The committee met on Tuesday to review the budget. After a long discussion, they agreed to postpone the "
    "decision until the auditors had finished their report, which is expected early next month.\n",
    "Вчера вечером мы долго гуляли по набережной и говорили о книгах, которые прочитали за лето. "
    "Погода была тёплой, а над рекой медленно садилось солнце.\n",
    "我们明天早上八点在火车站见面，然后一起去山里徒步。请记得带上水和雨衣，天气预报说下午可能会下雨。\n",
    "昨日は友達と一緒に新しいラーメン屋に行きました。スープがとても濃くて、麺も自家製だったので、また行きたいです。\n",
    "오늘 아침에 공원에서 산책을 하다가 오랜 친구를 우연히 만났습니다. 우리는 카페에 가서 한 시간 동안 이야기를 나눴어요.\n",
    "ذهبنا إلى السوق القديم في المدينة واشترينا بعض التوابل والفواكه الطازجة، ثم جلسنا في مقهى صغير نشرب الشاي.\n",
    "कल शाम को हम सब परिवार के साथ खाना खाने बाहर गए। खाना बहुत स्वादिष्ट था और सबने खूब बातें कीं।\n",
    "Το καλοκαίρι πήγαμε διακοπές σε ένα μικρό νησί του Αιγαίου, όπου κολυμπούσαμε κάθε πρωί στη θάλασσα.\n",
    "Chúng tôi đã đi du lịch Đà Lạt vào mùa xuân năm ngoái và rất thích khí hậu mát mẻ ở đó.\n",
    "Nous avons visité le musée d'Orsay samedi après-midi ; les tableaux impressionnistes étaient magnifiques.\n",
    "Die Straßenbahn fährt heute wegen Bauarbeiten nur bis zur Haltestelle am Hauptbahnhof, danach gibt es Ersatzbusse.\n",
    "ខ្ញុំចូលចិត្តអានសៀវភៅនៅពេលល្ងាច ជាពិសេសរឿងប្រវត្តិសាស្ត្រ។\n",
    "Release notes 🚀: fixed the crash on startup ✅, faster search 🔍 (about 2× on large folders) and new emoji 😶‍🌫️🦙.\n",
    "for (size_t i = 0; i < n; ++i) {\n    if (values[i] > threshold) { total += values[i] * 0.5; }\n}\n",
    "def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip(), value.strip()  # 3.14159\n",
};

std::string english_text(size_t size) {
  std::string source;
  std::set<fs::path> seen;
  const fs::path dir = "/usr/share/common-licenses";
  std::vector<fs::path> files;
  if (fs::exists(dir)) {
    for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::error_code ec;
    const fs::path real = fs::canonical(f, ec);
    if (ec || !fs::is_regular_file(real) || !seen.insert(real).second) continue;
    source += read_file(real);
  }
  if (source.empty()) source = kParagraphs[0];  // no license texts on this machine
  std::string text;
  while (text.size() < size) text += source;
  text.resize(size);
  // Do not end inside a character.
  while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) text.pop_back();
  if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0) text.pop_back();
  return text;
}

std::string mixed_text(size_t size, const fs::path& vocab_dir) {
  std::vector<std::string> pieces(std::begin(kParagraphs), std::end(kParagraphs));
  const std::string inp = read_file(vocab_dir / "ggml-vocab-llama-spm.gguf.inp");
  const std::string separator = "\n__ggml_vocab_test__\n";
  size_t start = 0;
  for (size_t pos; (pos = inp.find(separator, start)) != std::string::npos; start = pos + separator.size()) {
    pieces.push_back(inp.substr(start, pos - start) + "\n");
  }
  std::mt19937 rng(20240521);
  std::string text;
  while (text.size() < size) {
    std::shuffle(pieces.begin(), pieces.end(), rng);
    for (const auto& p : pieces) text += p;
  }
  // Cut at a character boundary.
  size_t cut = size;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  text.resize(cut);
  return text;
}

// Words of random characters from a dozen scripts: almost no word repeats,
// so no cache helps (a worst case, not natural text).
std::string random_words(size_t size) {
  struct Range {
    char32_t first, last;
  };
  const Range scripts[] = {{U'a', U'z'},         {U'A', U'Z'},         {0x430, 0x44F} /* Cyrillic */,
                           {0x3B1, 0x3C9} /* Greek */, {0x4E00, 0x9FA5} /* CJK */, {0xAC00, 0xD7A3} /* Hangul */,
                           {0x627, 0x64A} /* Arabic */, {0x915, 0x939} /* Devanagari */, {0x3041, 0x3096} /* Hiragana */,
                           {0xE0, 0xFF} /* Latin-1 letters */, {U'0', U'9'}, {0x1F600, 0x1F64F} /* emoji */};
  const char* const separators[] = {" ", " ", " ", " ", ", ", ". ", "\n", " - ", "  ", "\t"};
  std::mt19937 rng(7);
  std::string text;
  auto append = [&](char32_t cp) {
    if (cp < 0x80) {
      text += static_cast<char>(cp);
    } else if (cp < 0x800) {
      text += static_cast<char>(0xC0 | (cp >> 6));
      text += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      text += static_cast<char>(0xE0 | (cp >> 12));
      text += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      text += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      text += static_cast<char>(0xF0 | (cp >> 18));
      text += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      text += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      text += static_cast<char>(0x80 | (cp & 0x3F));
    }
  };
  while (text.size() < size) {
    const Range& r = scripts[rng() % std::size(scripts)];
    const unsigned length = 1 + static_cast<unsigned>(rng() % 9);
    for (unsigned i = 0; i < length; ++i) append(r.first + static_cast<char32_t>(rng() % (r.last - r.first + 1)));
    text += separators[rng() % std::size(separators)];
  }
  size_t cut = size;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  text.resize(cut);
  return text;
}

bool g_wall_clock = false;

// Seconds on the wall clock, or of this thread's CPU time (the default: on a
// shared machine the time other processes take the core is not ours).
double now_seconds() {
  if (g_wall_clock) return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

template <class F>
double best_seconds(int runs, F&& f) {
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    const double t0 = now_seconds();
    f();
    best = std::min(best, now_seconds() - t0);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path vocab_dir = fs::path(M40_SHARED_DIR) / "models" / "vocab";
  if (const char* env = std::getenv("M40_SHARED_DIR"); env != nullptr && *env != '\0') vocab_dir = fs::path(env) / "models" / "vocab";
  int runs = 5;
  size_t mib = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--vocab-dir" && i + 1 < argc) {
      vocab_dir = argv[++i];
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--wall") {
      g_wall_clock = true;
    } else if (a == "--mib" && i + 1 < argc) {
      mib = static_cast<size_t>(std::max(1, std::atoi(argv[++i])));
    } else {
      std::fprintf(stderr, "usage: %s [--vocab-dir DIR] [--runs N] [--mib N] [--wall]\n", argv[0]);
      return 2;
    }
  }

  const size_t size = mib << 20;
  const std::string english = english_text(size);
  const std::string mixed = mixed_text(size, vocab_dir);
  const std::string random = random_words(size);
  struct Text {
    const char* name;
    const std::string* bytes;
  };
  const Text texts[] = {{"english", &english}, {"mixed-script", &mixed}, {"random-words", &random}};
  const char* const vocab_names[] = {"llama-spm", "gpt-2", "deepseek-llm", "falcon"};

  std::printf("tokenizer throughput, %zu MiB per text, best of %d runs, 1 thread, %s time; MB/s = 10^6 bytes of text per second\n",
              mib, runs, g_wall_clock ? "wall-clock" : "thread CPU");
  std::printf("(llama.cpp tokenizes at tens of MB/s)\n\n");
  std::printf("| vocabulary | kind | text | tokens | bytes/token | encode MB/s | decode MB/s | stream MB/s | round trip |\n");
  std::printf("|---|---|---|---:|---:|---:|---:|---:|---|\n");
  int failures = 0;
  for (const char* name : vocab_names) {
    const fs::path path = vocab_dir / (std::string("ggml-vocab-") + name + ".gguf");
    if (!fs::exists(path)) {
      std::printf("| %s | (missing: %s) |\n", name, path.c_str());
      continue;
    }
    const Vocab vocab = Vocab::from_file(path.string());
    for (const Text& t : texts) {
      std::vector<TokenId> ids;
      const double encode_s = best_seconds(runs, [&] {
        ids.clear();
        vocab.encode(*t.bytes, {.add_special = false, .parse_special = false}, ids);
      });
      std::string decoded;
      const double decode_s = best_seconds(runs, [&] { decoded = vocab.decode(ids); });
      std::string streamed;
      const double stream_s = best_seconds(runs, [&] {
        streamed.clear();
        StreamingDetokenizer stream(vocab);
        for (TokenId id : ids) stream.push(id, streamed);
        stream.flush(streamed);
      });
      const bool exact = streamed == *t.bytes;
      if (!exact) ++failures;
      const double mb = static_cast<double>(t.bytes->size()) / 1e6;
      std::printf("| %s | %s | %s | %zu | %.2f | %.1f | %.1f | %.1f | %s |\n", name,
                  vocab.kind() == m40::tokenizer::VocabKind::kSpm ? "SPM" : "BPE", t.name, ids.size(),
                  static_cast<double>(t.bytes->size()) / static_cast<double>(ids.size()), mb / encode_s, mb / decode_s,
                  mb / stream_s, exact ? "exact" : "DIFFERS");
    }
  }
  return failures == 0 ? 0 : 1;
}
