#include "cli/line_reader.h"

#include <histedit.h>

#include <cstdio>
#include <iostream>

#include "common/error.h"

namespace m40::cli {

namespace {

class TerminalReader : public LineReader {
 public:
  explicit TerminalReader(std::string history_file) : history_file_(std::move(history_file)) {
    el_ = el_init("m40-llm", stdin, stdout, stderr);
    history_ = history_init();
    if (el_ == nullptr || history_ == nullptr) throw Error("cannot set up line editing on this terminal");
    HistEvent ev;
    history(history_, &ev, H_SETSIZE, 1000);
    history(history_, &ev, H_SETUNIQUE, 1);
    if (!history_file_.empty()) history(history_, &ev, H_LOAD, history_file_.c_str());
    el_set(el_, EL_CLIENTDATA, this);
    el_set(el_, EL_EDITOR, "emacs");
    el_set(el_, EL_HIST, history, history_);
    el_set(el_, EL_PROMPT, &TerminalReader::prompt_of);
    // While a line is edited the terminal sends Ctrl-C as a character (no
    // SIGINT), which interrupt_key handles; answers are streamed in the
    // terminal's normal mode, where Ctrl-C is the signal that stops them.
    el_set(el_, EL_SETTY, "-d", "-isig", nullptr);
    el_set(el_, EL_ADDFN, "m40-interrupt", "Drop the line (Ctrl-C)", &TerminalReader::interrupt_key);
    el_set(el_, EL_BIND, "^C", "m40-interrupt", nullptr);
    el_source(el_, nullptr);  // the user's ~/.editrc, as every libedit program reads it
  }
  ~TerminalReader() override {
    if (el_ != nullptr) el_end(el_);
    if (history_ != nullptr) history_end(history_);
  }
  TerminalReader(const TerminalReader&) = delete;
  TerminalReader& operator=(const TerminalReader&) = delete;

  ReadStatus read(const std::string& prompt, std::string& line) override {
    prompt_ = prompt;
    interrupted_ = false;
    int count = 0;
    const char* text = el_gets(el_, &count);
    if (interrupted_) {
      std::fputs("\n", stdout);
      line = text != nullptr ? text : "";
      return ReadStatus::Interrupted;
    }
    if (text == nullptr || count <= 0) return ReadStatus::End;
    line.assign(text, static_cast<size_t>(count));
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    return ReadStatus::Line;
  }

  void remember(const std::string& entry) override {
    if (entry.empty()) return;
    HistEvent ev;
    history(history_, &ev, H_ENTER, entry.c_str());
    if (!history_file_.empty()) history(history_, &ev, H_SAVE, history_file_.c_str());
  }

 private:
  static TerminalReader& self(EditLine* el) {
    void* data = nullptr;
    el_get(el, EL_CLIENTDATA, &data);
    return *static_cast<TerminalReader*>(data);
  }
  static char* prompt_of(EditLine* el) { return self(el).prompt_.data(); }
  static unsigned char interrupt_key(EditLine* el, int) {
    self(el).interrupted_ = true;
    return CC_NEWLINE;  // el_gets returns the line as it stands
  }

  EditLine* el_ = nullptr;
  History* history_ = nullptr;
  std::string history_file_;
  std::string prompt_;
  bool interrupted_ = false;
};

class StreamReader : public LineReader {
 public:
  ReadStatus read(const std::string&, std::string& line) override {
    if (!std::getline(std::cin, line)) return ReadStatus::End;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return ReadStatus::Line;
  }
  void remember(const std::string&) override {}
};

}  // namespace

std::unique_ptr<LineReader> make_terminal_reader(const std::string& history_file) {
  return std::make_unique<TerminalReader>(history_file);
}

std::unique_ptr<LineReader> make_stream_reader() { return std::make_unique<StreamReader>(); }

}  // namespace m40::cli
