// `m40-llm chat-template`: renders a chat template the way the server will
// when it turns messages into a prompt, and prints the prompt exactly (no
// newline added), so that a template can be checked against transformers'
// apply_chat_template before any model runs.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat/model_template.h"
#include "cli/commands.h"
#include "common/error.h"
#include "gguf/file.h"
#include "store/model_ref.h"

namespace m40::cli {

namespace {

using Json = nlohmann::ordered_json;

struct ChatTemplateOptions {
  std::string model;
  std::string template_file;
  std::string template_name;
  std::string bos;
  std::string eos;
  std::string messages_file;
  std::string tools_file;
  std::vector<std::string> vars;
  std::string date;
  bool bos_given = false;
  bool eos_given = false;
  bool no_generation_prompt = false;
  bool print_template = false;
};

std::string read_text(const std::string& path) {
  if (path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Json read_json(const std::string& path, const char* what) {
  try {
    return Json::parse(read_text(path));
  } catch (const Json::parse_error& e) {
    throw Error(std::string("the ") + what + " file " + path + " is not valid JSON: " + e.what());
  }
}

// YYYY-MM-DD, optionally followed by THH:MM or THH:MM:SS (or a space).
chat::DateTime parse_date(const std::string& text) {
  chat::DateTime t;
  char sep = 0;
  const int n = std::sscanf(text.c_str(), "%4d-%2d-%2d%c%2d:%2d:%2d", &t.year, &t.month, &t.day, &sep, &t.hour,
                            &t.minute, &t.second);
  const bool ok = (n == 3 && text.size() == 10) || ((n == 6 || n == 7) && (sep == 'T' || sep == ' '));
  if (!ok || t.month < 1 || t.month > 12 || t.day < 1 || t.day > 31 || t.hour > 23 || t.minute > 59 ||
      t.second > 60) {
    throw Error("--date wants YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS], got '" + text + "'");
  }
  return t;
}

int run_chat_template(const ChatTemplateOptions& o) {
  if (o.model.empty() == o.template_file.empty()) {
    throw Error("give either a MODEL file or --template FILE (see m40-llm chat-template --help)");
  }
  std::unique_ptr<chat::ChatTemplate> tpl;
  chat::RenderOptions options;
  if (!o.model.empty()) {
    const gguf::File file = gguf::File::open(store::resolve_model(o.model));
    chat::ModelChatTemplate model = chat::model_chat_template(file, o.template_name);
    if (model.is_fallback() && !o.print_template) {
      std::fprintf(stderr, "note: %s has no chat template; using the %s (docs/chat-templates.md)\n", o.model.c_str(),
                   chat::template_origin_name(model.origin));
    }
    options = model.options();
    tpl = std::make_unique<chat::ChatTemplate>(std::move(model.chat_template));
  } else {
    tpl = std::make_unique<chat::ChatTemplate>(read_text(o.template_file));
  }
  if (o.bos_given || o.model.empty()) options.bos_token = o.bos;
  if (o.eos_given || o.model.empty()) options.eos_token = o.eos;

  if (o.print_template) {
    std::fwrite(tpl->source().data(), 1, tpl->source().size(), stdout);
    return 0;
  }
  if (o.messages_file.empty()) throw Error("--messages FILE is required (a JSON array of messages, or - for stdin)");

  Json doc = read_json(o.messages_file, "messages");
  Json messages = doc;
  // An OpenAI-style request body works too: {"messages": [...], "tools": [...]}.
  if (doc.is_object()) {
    if (!doc.contains("messages")) throw Error(o.messages_file + ": a JSON object needs a \"messages\" array");
    messages = doc["messages"];
    if (doc.contains("tools")) options.tools = doc["tools"];
  }
  if (!o.tools_file.empty()) options.tools = read_json(o.tools_file, "tools");
  options.add_generation_prompt = !o.no_generation_prompt;
  for (const std::string& var : o.vars) {
    const size_t eq = var.find('=');
    if (eq == std::string::npos || eq == 0) throw Error("--var wants NAME=JSON, got '" + var + "'");
    const std::string value = var.substr(eq + 1);
    Json parsed;
    try {
      parsed = Json::parse(value);
    } catch (const Json::parse_error&) {
      parsed = value;  // not JSON: a plain string
    }
    options.extra_variables[var.substr(0, eq)] = parsed;
  }
  if (!o.date.empty()) options.now = parse_date(o.date);

  const std::string prompt = tpl->render(messages, options);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  return 0;
}

}  // namespace

void register_chat_template_command(CLI::App& app) {
  auto opts = std::make_shared<ChatTemplateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "chat-template",
      "Render a chat template: print the prompt a list of messages becomes, exactly (no newline added).\n"
      "The template is the model's tokenizer.chat_template (with its BOS/EOS token texts), or a Jinja file.\n"
      "Output matches Hugging Face transformers' apply_chat_template(..., tokenize=False).\n"
      "Examples:\n"
      "  m40-llm chat-template model.gguf --messages chat.json\n"
      "  m40-llm chat-template model.gguf --messages chat.json --no-generation-prompt --var enable_thinking=false\n"
      "  m40-llm chat-template --template tpl.jinja --bos '<s>' --eos '</s>' --messages chat.json\n"
      "  m40-llm chat-template model.gguf --print-template\n"
      "chat.json holds [{\"role\": \"user\", \"content\": \"Hello!\"}, ...] or {\"messages\": [...], \"tools\": [...]}.\n"
      "A model without a template gets the fallback described in docs/chat-templates.md.");
  cmd->add_option("MODEL", opts->model, "A store name or GGUF file whose template to render");
  cmd->add_option("--template", opts->template_file, "Jinja template file to render instead of a model's")
      ->check(CLI::ExistingFile);
  cmd->add_option("--template-name", opts->template_name,
                  "Use the model's named template tokenizer.chat_template.NAME (e.g. tool_use)");
  cmd->add_option("--messages", opts->messages_file, "JSON file of messages ('-' reads stdin)");
  cmd->add_option("--tools", opts->tools_file, "JSON file with a tools array (OpenAI function definitions)");
  cmd->add_option("--bos", opts->bos, "bos_token text (default: the model's BOS token; '' with --template)");
  cmd->add_option("--eos", opts->eos, "eos_token text (default: the model's EOS token; '' with --template)");
  cmd->add_flag("--no-generation-prompt", opts->no_generation_prompt,
                "Do not append the assistant turn opening (add_generation_prompt=false)");
  cmd->add_option("--var", opts->vars, "Extra template variable NAME=JSON (e.g. enable_thinking=false); repeatable");
  cmd->add_option("--date", opts->date, "Date strftime_now() sees, YYYY-MM-DD[THH:MM[:SS]] (default: now)");
  cmd->add_flag("--print-template", opts->print_template, "Print the template source (model's or fallback) and exit");
  cmd->callback([opts, cmd] {
    opts->bos_given = cmd->count("--bos") > 0;
    opts->eos_given = cmd->count("--eos") > 0;
    set_command_action([opts] { return run_chat_template(*opts); });
  });
}

}  // namespace m40::cli
