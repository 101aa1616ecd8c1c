#include "cli/interactive_chat.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <clocale>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "chat/model_template.h"
#include "cli/line_reader.h"
#include "cli/timings.h"
#include "store/store.h"

namespace m40::cli {

namespace {

// Set by Ctrl-C (SIGINT) while an answer streams; the session polls it.
std::atomic<bool> g_stop_answer{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void on_sigint(int) { g_stop_answer.store(true); }

// Ctrl-C stops the answer instead of the program while this is alive.
class AnswerInterruptible {
 public:
  AnswerInterruptible() {
    g_stop_answer.store(false);
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // writes to the terminal carry on
    sigaction(SIGINT, &sa, &previous_);
  }
  ~AnswerInterruptible() { sigaction(SIGINT, &previous_, nullptr); }
  AnswerInterruptible(const AnswerInterruptible&) = delete;
  AnswerInterruptible& operator=(const AnswerInterruptible&) = delete;

 private:
  struct sigaction previous_ {};
};

constexpr const char* kPrompt = ">>> ";
constexpr const char* kContinuationPrompt = "... ";
constexpr const char* kFence = "\"\"\"";

std::string history_file() {
  std::error_code ec;
  const auto home = store::Store::from_environment().home();
  std::filesystem::create_directories(home, ec);
  return ec ? "" : (home / "history").string();
}

std::string trim(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  const size_t end = s.find_last_not_of(" \t\r\n");
  return s.substr(begin, end - begin + 1);
}

void answer(ChatSession& session, const ChatSettings& settings, const std::string& message, double load_seconds) {
  const auto start = std::chrono::steady_clock::now();
  TurnResult r;
  bool streamed = false;
  {
    AnswerInterruptible interruptible;
    try {
      r = session.send(message, settings.options(),
                       [&streamed](std::string_view text) {
                         streamed = true;
                         std::fwrite(text.data(), 1, text.size(), stdout);
                         std::fflush(stdout);
                       },
                       g_stop_answer);
    } catch (const Error& e) {
      // One turn failed (the context overflowed, the template raised, the
      // backend failed): the session dropped the turn, and the chat goes on.
      if (streamed) std::fputs("\n\n", stdout);
      std::fflush(stdout);
      std::fprintf(stderr, "Error: %s\n\n", e.what());
      return;
    }
  }
  std::fputs("\n\n", stdout);
  if (r.finish_reason == engine::FinishReason::ContextFull) {
    std::printf("(the context of %d tokens is full; the answer stops here: /clear to start over)\n\n", session.n_ctx());
  }
  std::fflush(stdout);
  if (settings.verbose) {
    print_timings(stderr, {.total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                           .load_seconds = load_seconds,
                           .prompt_tokens = r.prompt_tokens - r.reused_tokens,
                           .prompt_seconds = r.prompt_seconds,
                           .generated_tokens = r.generated_tokens,
                           .generate_seconds = r.generate_seconds});
    std::fprintf(stderr, "%-22s%d token(s)\n\n", "prompt cache reused:", r.reused_tokens);
  }
}

}  // namespace

int run_interactive_chat(const model::LoadedModel& model, const tokenizer::Vocab& vocab, backend::Backend& backend,
                         ChatSettings settings, double load_seconds) {
  const bool terminal = ::isatty(STDIN_FILENO) == 1;
  std::unique_ptr<LineReader> reader;
  if (terminal) {
    std::setlocale(LC_CTYPE, "");  // libedit reads UTF-8 input by the locale
    reader = make_terminal_reader(history_file());
  } else {
    reader = make_stream_reader();
  }
  ChatSession session(backend, vocab, chat::model_chat_template(model.file), settings.generation.batch_size);
  ChatCommands commands(session, settings, model_info_text(model.file, backend.n_ctx(), backend.name()));

  std::string pending;  // a multi-line message so far
  bool in_fence = false;
  for (double load = load_seconds;; load = 0) {
    std::string line;
    const ReadStatus status = reader->read(in_fence ? kContinuationPrompt : kPrompt, line);
    if (status == ReadStatus::End) {
      if (terminal) std::fputs("\n", stdout);
      return 0;
    }
    if (status == ReadStatus::Interrupted) {
      if (!in_fence && line.empty()) std::puts("Use Ctrl + d or /bye to exit.");
      in_fence = false;
      pending.clear();
      continue;
    }

    std::string message;
    if (in_fence) {
      // The message ends at a line that ends with """.
      const bool closes = line.ends_with(kFence);
      if (closes) line.resize(line.size() - 3);
      pending.append("\n").append(line);
      if (!closes) continue;
      in_fence = false;
      message = trim(pending);
      pending.clear();
    } else if (line.starts_with(kFence)) {
      std::string rest = line.substr(3);
      if (rest.size() >= 3 && rest.ends_with(kFence)) {
        message = trim(rest.substr(0, rest.size() - 3));
      } else {
        in_fence = true;
        pending = rest;
        continue;
      }
    } else if (line.starts_with("/")) {
      reader->remember(line);
      std::string out;
      const CommandResult result = commands.run(line, out);
      std::fputs(out.c_str(), stdout);
      std::fflush(stdout);
      if (result == CommandResult::Exit) return 0;
      continue;
    } else {
      message = line;
    }
    if (trim(message).empty()) continue;
    reader->remember(message);
    answer(session, settings, message, load);
  }
}

}  // namespace m40::cli
