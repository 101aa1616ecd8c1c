#include "cli/chat_commands.h"

#include <cstdio>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "gguf/file.h"
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

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

// An integer parameter's values. Past `high` it is `high` when `clamp_high`
// says that means the same (as the server does: top_k and num_predict past
// int32 are clamped); otherwise a value outside [low, high] is refused.
struct IntRange {
  int64_t low;
  int64_t high;
  bool clamp_high;
  bool negative_is_minus_one = false;  // num_predict: any negative value is -1
};

std::string format_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}

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

const char* kParameterHelp =
    "Available Parameters:\n"
    "  /set parameter seed <int>              Random number seed (-1: random)\n"
    "  /set parameter num_predict <int>       Max number of tokens to predict (-1: until the end)\n"
    "  /set parameter top_k <int>             Pick from top k num of tokens\n"
    "  /set parameter top_p <float>           Pick token based on sum of probabilities\n"
    "  /set parameter min_p <float>           Pick token based on top token probability * min_p\n"
    "  /set parameter temperature <float>     Set creativity level (0: greedy)\n"
    "  /set parameter repeat_penalty <float>  How strongly to penalize repetitions\n"
    "  /set parameter repeat_last_n <int>     Set how far back to look for repetitions\n"
    "  /set parameter presence_penalty <float>   Penalty for any earlier occurrence\n"
    "  /set parameter frequency_penalty <float>  Penalty per earlier occurrence\n"
    "  /set parameter stop <string> <string> ...  Set the stop parameters\n";

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
  auto& sp = settings_.generation.sampler;
  const std::string& v = values.front();
  const auto set_float = [&](float& target) -> std::string {
    float f = 0;
    if (!parse_float(v, f)) return "Couldn't set parameter: '" + v + "' is not a number for " + name + "\n";
    target = f;
    return "";
  };
  std::string note;    // why the value stored is not the one typed
  std::string stored;  // the value stored, where the note says why it differs
  const auto set_int = [&](auto& target, IntRange range) -> std::string {
    using Target = std::remove_reference_t<decltype(target)>;
    static_assert(std::numeric_limits<Target>::min() <= 0);
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
          break;
        }
        if (v.find('-') != std::string::npos && range.negative_is_minus_one) {
          i = -2;  // any negative value: -1, said so below
          break;
        }
        return "Couldn't set parameter: '" + v + "' is out of range for " + name + " (" + allowed + ")\n";
    }
    if (range.negative_is_minus_one && i < 0) {
      if (i != -1) note = " (any negative value means no limit)";
      i = -1;
    }
    if (i > range.high && range.clamp_high) {
      note = " (the largest it takes; " + v + " is past it)";
      i = range.high;
    }
    if (i < range.low || i > range.high) {
      return "Couldn't set parameter: '" + v + "' is out of range for " + name + " (" + allowed + ")\n";
    }
    target = static_cast<Target>(i);
    stored = std::to_string(i);
    return "";
  };
  std::string error;
  const auto old = settings_;
  if (name == "temperature") error = set_float(sp.temperature);
  // top_k: 0 or less is off; past int32 (past any vocabulary) is no limit.
  else if (name == "top_k") error = set_int(sp.top_k, {kInt32Min, kInt32Max, true});
  else if (name == "top_p") error = set_float(sp.top_p);
  else if (name == "min_p") error = set_float(sp.min_p);
  else if (name == "repeat_penalty") error = set_float(sp.repeat_penalty);
  // repeat_last_n: -1 every token, 0 off; a window past int32 is past any context.
  else if (name == "repeat_last_n") error = set_int(sp.penalty_last_n, {-1, kInt32Max, true});
  else if (name == "presence_penalty") error = set_float(sp.presence_penalty);
  else if (name == "frequency_penalty") error = set_float(sp.frequency_penalty);
  else if (name == "seed") error = set_int(settings_.seed, {kInt64Min, kInt64Max, false});
  // num_predict: past int32 the context ends the answer first, as on the server.
  else if (name == "num_predict") error = set_int(settings_.generation.max_tokens, {-1, kInt32Max, true, true});
  else if (name == "stop") settings_.generation.stop = values;
  else return "Couldn't set parameter: unknown parameter '" + name + "' (/set parameter lists them)\n";
  if (!error.empty()) return error;
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
  const auto& sp = settings_.generation.sampler;
  std::string stops;
  for (const auto& s : settings_.generation.stop) stops += (stops.empty() ? "\"" : " \"") + s + "\"";
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"temperature", format_float(sp.temperature)},
      {"top_k", std::to_string(sp.top_k)},
      {"top_p", format_float(sp.top_p)},
      {"min_p", format_float(sp.min_p)},
      {"repeat_penalty", format_float(sp.repeat_penalty)},
      {"repeat_last_n", std::to_string(sp.penalty_last_n)},
      {"presence_penalty", format_float(sp.presence_penalty)},
      {"frequency_penalty", format_float(sp.frequency_penalty)},
      {"seed", std::to_string(settings_.seed)},
      {"num_predict", std::to_string(settings_.generation.max_tokens)},
      {"stop", stops.empty() ? "(none)" : stops},
  };
  std::string out = "Parameters:\n";
  for (const auto& [key, value] : rows) {
    char line[512];
    std::snprintf(line, sizeof line, "  %-20s%s\n", key.c_str(), value.c_str());
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
      if (words.size() < 3) out = kParameterHelp;
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
