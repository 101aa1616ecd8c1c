#include "cli/chat_commands.h"

#include <cstdio>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "gguf/file.h"
#include "engine/request_options.h"
#include "engine/sampler.h"
#include "model/model_summary.h"

namespace m40::cli {

namespace {

std::vector<std::string> split_words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// The text after the first `n` words, as typed (inner spaces kept).
std::string rest_after_words(const std::string& line, size_t n) {
  size_t pos = 0;
  for (size_t i = 0; i < n; ++i) {
    pos = line.find_first_not_of(" \t", pos);
    pos = line.find_first_of(" \t", pos);
    if (pos == std::string::npos) return "";
  }
  pos = line.find_first_not_of(" \t", pos);
  if (pos == std::string::npos) return "";
  std::string rest = line.substr(pos);
  while (!rest.empty() && (rest.back() == ' ' || rest.back() == '\t')) rest.pop_back();
  return rest;
}

bool parse_float(const std::string& text, float& out) {
  try {
    size_t used = 0;
    const float v = std::stof(text, &used);
    if (used != text.size()) return false;
    out = v;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

enum class IntParse { Ok, NotAnInteger, OutOfRange };

IntParse parse_int(const std::string& text, int64_t& out) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used != text.size()) return IntParse::NotAnInteger;
    out = v;
    return IntParse::Ok;
  } catch (const std::out_of_range&) {
    return IntParse::OutOfRange;
  } catch (const std::exception&) {
    return IntParse::NotAnInteger;
  }
}

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();


std::string unknown_command(const std::string& line) {
  return "Unknown command '" + split_words(line).front() + "'. Type /? for help\n";
}

const char* kSetHelp =
    "Available Commands:\n"
    "  /set parameter ...     Set a parameter\n"
    "  /set system <string>   Set system message\n"
    "  /set verbose           Show timings after each answer\n"
    "  /set quiet             Hide the timings\n";

const char* kShowHelp =
    "Available Commands:\n"
    "  /show info         Show details for this model\n"
    "  /show parameters   Show the parameters in use\n"
    "  /show system       Show the system message\n"
    "  /show template     Show the chat template\n";


// /set parameter's list, from the options table.
std::string parameter_help_text() {
  std::string out = "Available Parameters:\n";
  for (const engine::RequestOption& o : engine::request_options()) {
    const char* kind = o.kind == engine::OptionKind::Real      ? "<float>"
                       : o.kind == engine::OptionKind::Integer ? "<int>"
                                                               : "<string> <string> ...";
    const std::string usage = "/set parameter " + std::string(o.name) + " " + kind;
    char line[512];
    std::snprintf(line, sizeof line, "  %-38s  %s\n", usage.c_str(), std::string(o.help).c_str());
    out += line;
  }
  return out;
}

const char* kShortcutsHelp =
    "Available keyboard shortcuts:\n"
    "  Ctrl + a            Move to the beginning of the line (Home)\n"
    "  Ctrl + e            Move to the end of the line (End)\n"
    "  Ctrl + k            Delete the sentence after the cursor\n"
    "  Ctrl + u            Delete the sentence before the cursor\n"
    "  Ctrl + w            Delete the word before the cursor\n"
    "  Up / Down           Earlier and later messages\n"
    "  Ctrl + l            Clear the screen\n"
    "  Ctrl + c            Stop the model from responding\n"
    "  Ctrl + d            Exit (/bye)\n";

}  // namespace

engine::GenerationOptions ChatSettings::options() const {
  engine::GenerationOptions o = generation;
  o.sampler.seed = seed < 0 ? engine::kRandomSeed : static_cast<uint64_t>(seed);
  return o;
}

std::string chat_help_text() {
  return "Available Commands:\n"
         "  /set            Set session variables\n"
         "  /show           Show model information\n"
         "  /clear          Clear session context\n"
         "  /bye            Exit\n"
         "  /?, /help       Help for a command\n"
         "  /? shortcuts    Help for keyboard shortcuts\n"
         "\n"
         "Use \"\"\" to begin a multi-line message.\n";
}

std::string model_info_text(const gguf::File& file, int n_ctx, const std::string& backend_name) {
  const auto s = model::summarize(file);
  std::vector<std::pair<std::string, std::string>> rows;
  rows.emplace_back("architecture", s.architecture.empty() ? "unknown" : s.architecture);
  if (s.name) rows.emplace_back("name", *s.name);
  rows.emplace_back("parameters", model::format_parameter_count(s.parameter_count));
  if (s.context_length) rows.emplace_back("context length", std::to_string(*s.context_length));
  if (s.embedding_length) rows.emplace_back("embedding length", std::to_string(*s.embedding_length));
  if (s.file_type) {
    std::string quant = model::file_type_name(*s.file_type).value_or(std::to_string(*s.file_type));
    for (const char* prefix : {"MOSTLY_", "ALL_"}) {
      if (quant.starts_with(prefix)) quant.erase(0, std::string(prefix).size());
    }
    rows.emplace_back("quantization", quant);
  }
  std::string out = "  Model\n";
  for (const auto& [key, value] : rows) {
    char line[256];
    std::snprintf(line, sizeof line, "    %-20s%s\n", key.c_str(), value.c_str());
    out += line;
  }
  char line[256];
  out += "\n  Session\n";
  std::snprintf(line, sizeof line, "    %-20s%d tokens\n", "context in use", n_ctx);
  out += line;
  std::snprintf(line, sizeof line, "    %-20s%s\n", "backend", backend_name.c_str());
  out += line;
  return out;
}

std::string ChatCommands::set_parameter(const std::string& name, const std::vector<std::string>& values) {
  if (values.empty()) return "Usage: /set parameter " + name + " <value>\n";
  const engine::RequestOption* option = engine::find_request_option(name);
  if (option == nullptr) return "Couldn't set parameter: unknown parameter '" + name + "' (/set parameter lists them)\n";
  const std::string& v = values.front();
  const auto old = settings_;
  engine::OptionTargets targets = settings_.targets();
  std::string note;  // why the value stored is not the one typed
  std::string stored;
  switch (option->kind) {
    case engine::OptionKind::Real: {
      float f = 0;
      if (!parse_float(v, f)) return "Couldn't set parameter: '" + v + "' is not a number for " + name + "\n";
      option->set_real(targets, f);
      break;
    }
    case engine::OptionKind::Integer: {
      const engine::IntegerRange& range = option->integers;
      const std::string allowed = std::to_string(range.low) + ".." + std::to_string(range.high);
      int64_t i = 0;
      switch (parse_int(v, i)) {
        case IntParse::Ok:
          break;
        case IntParse::NotAnInteger:
          return "Couldn't set parameter: '" + v + "' is not an integer for " + name + "\n";
        case IntParse::OutOfRange:
          // Past int64: as far past the range as any value can be.
          if (v.find('-') == std::string::npos && range.clamp_high) {
            i = kInt64Max;
          } else if (v.find('-') != std::string::npos && range.clamp_low) {
            i = std::numeric_limits<int64_t>::min();
          } else if (v.find('-') != std::string::npos && range.negative_is_minus_one) {
            i = -2;  // any negative value: -1, said so below
          } else {
            return "Couldn't set parameter: '" + v + "' is out of range for " + name + " (" + allowed + ")\n";
          }
          break;
      }
      int64_t fitted = 0;
      switch (engine::fit_integer(range, i, fitted)) {
        case engine::IntegerFit::Refused:
          return "Couldn't set parameter: '" + v + "' is out of range for " + name + " (" + allowed + ")\n";
        case engine::IntegerFit::MinusOne: note = " (any negative value means no limit)"; break;
        case engine::IntegerFit::Clamped: note = " (the largest it takes; " + v + " is past it)"; break;
        case engine::IntegerFit::ClampedLow: note = " (the smallest it takes; " + v + " is past it)"; break;
        case engine::IntegerFit::Kept: break;
      }
      option->set_integer(targets, fitted);
      stored = std::to_string(fitted);
      break;
    }
    case engine::OptionKind::Strings:
      option->set_strings(targets, values);
      break;
  }
  // The sampler checks the values' domains (NaN, a negative penalty, ...).
  try {
    engine::Sampler check(settings_.options().sampler, 2);
  } catch (const std::exception& e) {
    settings_ = old;
    return std::string("Couldn't set parameter: ") + e.what() + "\n";
  }
  std::string shown;
  if (!note.empty()) {
    shown = stored;  // what was set, not what was typed
  } else {
    for (const auto& value : values) shown += (shown.empty() ? "" : ", ") + value;
  }
  return "Set parameter '" + name + "' to '" + shown + "'" + note + "\n";
}

std::string ChatCommands::parameters_text() const {
  // The table's order puts seed and num_predict first; /show parameters
  // lists the sampler's controls first, as Ollama does.
  static constexpr std::string_view kOrder[] = {"temperature",      "top_k",           "top_p",
                                                "min_p",            "repeat_penalty",  "repeat_last_n",
                                                "presence_penalty", "frequency_penalty", "seed",
                                                "num_predict",      "stop"};
  ChatSettings copy = settings_;
  const engine::OptionTargets targets = copy.targets();
  std::string out = "Parameters:\n";
  for (std::string_view name : kOrder) {
    const engine::RequestOption* option = engine::find_request_option(name);
    char line[512];
    std::snprintf(line, sizeof line, "  %-20s%s\n", std::string(name).c_str(), option->show(targets).c_str());
    out += line;
  }
  return out;
}

std::string ChatCommands::show(const std::vector<std::string>& words) const {
  if (words.size() < 2) return kShowHelp;
  const std::string& what = words[1];
  if (what == "info") return model_info_;
  if (what == "parameters") return parameters_text();
  if (what == "system") return session_.system().empty() ? "No system message was specified.\n" : session_.system() + "\n";
  if (what == "template") return session_.chat_template().chat_template.source() + "\n";
  return "Unknown command '/show " + what + "'. Type /? for help\n";
}

CommandResult ChatCommands::run(const std::string& line, std::string& out) {
  const auto words = split_words(line);
  if (words.empty()) return CommandResult::Continue;
  const std::string& cmd = words.front();
  if (cmd == "/bye" || cmd == "/exit") return CommandResult::Exit;
  if (cmd == "/?" || cmd == "/help") {
    if (words.size() > 1 && words[1] == "shortcuts") out = kShortcutsHelp;
    else if (words.size() > 1 && words[1] == "set") out = kSetHelp;
    else if (words.size() > 1 && words[1] == "show") out = kShowHelp;
    else out = chat_help_text();
  } else if (cmd == "/clear") {
    session_.clear();
    out = "Cleared session context\n";
  } else if (cmd == "/show") {
    out = show(words);
  } else if (cmd == "/set") {
    if (words.size() < 2) {
      out = kSetHelp;
    } else if (words[1] == "parameter") {
      if (words.size() < 3) out = parameter_help_text();
      else out = set_parameter(words[2], std::vector<std::string>(words.begin() + 3, words.end()));
    } else if (words[1] == "system") {
      session_.set_system(rest_after_words(line, 2));
      out = session_.system().empty() ? "Cleared system message.\n" : "Set system message.\n";
    } else if (words[1] == "verbose") {
      settings_.verbose = true;
      out = "Set 'verbose' mode.\n";
    } else if (words[1] == "quiet") {
      settings_.verbose = false;
      out = "Set 'quiet' mode.\n";
    } else {
      out = "Unknown command '/set " + words[1] + "'. Type /? for help\n";
    }
  } else {
    out = unknown_command(line);
  }
  return CommandResult::Continue;
}

}  // namespace m40::cli
