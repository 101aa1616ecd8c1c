// Where the interactive `m40-llm run` gets its lines: a terminal, with line
// editing and history (libedit), or plain lines from a pipe or file.
#pragma once

#include <memory>
#include <string>

namespace m40::cli {

enum class ReadStatus {
  Line,         // a line (without its newline)
  Interrupted,  // Ctrl-C at the prompt: the line typed so far is dropped
  End,          // Ctrl-D on an empty line, or the end of the input
};

class LineReader {
 public:
  virtual ~LineReader() = default;
  // Shows `prompt` (on a terminal) and reads one line into `line`.
  virtual ReadStatus read(const std::string& prompt, std::string& line) = 0;
  // Remembers a message for the Up key (no-op off a terminal).
  virtual void remember(const std::string& entry) = 0;
};

// libedit on the terminal: emacs keys, history kept in `history_file` (none
// when empty). Ctrl-C at the prompt is a key, not a signal, so it can drop
// the line without ending the program.
std::unique_ptr<LineReader> make_terminal_reader(const std::string& history_file);
// Lines from stdin with no prompt and no editing.
std::unique_ptr<LineReader> make_stream_reader();

}  // namespace m40::cli
