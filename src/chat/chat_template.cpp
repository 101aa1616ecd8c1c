#include "chat/chat_template.h"

#include "chat/jinja/interpreter.h"
#include "chat/jinja/parser.h"
#include "chat/jinja/python.h"

namespace m40::chat {

ChatTemplate::ChatTemplate(std::string source)
    : source_(std::move(source)), tree_(std::make_shared<const jinja::Template>(jinja::parse(source_))) {}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const RenderOptions& options) const {
  using jinja::Value;
  if (!messages.is_array()) {
    throw Error("chat messages must be a JSON array of {\"role\", \"content\"} objects, not " +
                std::string(messages.type_name()));
  }
  const auto convert = [](const nlohmann::ordered_json& j, const char* what) {
    try {
      return jinja::from_json(j);
    } catch (const jinja::Failure& f) {
      throw Error(std::string("chat ") + what + ": " + f.what());
    }
  };
  // The variables transformers passes to the template.
  jinja::Dict vars;
  vars.set(Value("messages"), convert(messages, "messages"));
  vars.set(Value("tools"), convert(options.tools, "tools"));
  vars.set(Value("documents"), convert(options.documents, "documents"));
  vars.set(Value("add_generation_prompt"), Value(options.add_generation_prompt));
  vars.set(Value("bos_token"), Value(options.bos_token));
  vars.set(Value("eos_token"), Value(options.eos_token));
  vars.set(Value("raise_exception"), Value::function("raise_exception", [](jinja::Interpreter& in, jinja::CallArgs& a) -> Value {
             const std::string message = a.positional.empty() ? std::string() : jinja::str(a.positional[0]);
             throw TemplateRaisedError(message, in.current_line());
           }));
  const DateTime now = options.now ? *options.now : local_now();
  vars.set(Value("strftime_now"), Value::function("strftime_now", [now](jinja::Interpreter&, jinja::CallArgs& a) {
             if (a.positional.size() != 1 || !a.positional[0].is_string()) {
               throw jinja::Failure("strftime_now() takes one format string");
             }
             return Value(strftime(a.positional[0].as_string(), now));
           }));
  if (!options.extra_variables.is_null()) {
    if (!options.extra_variables.is_object()) throw Error("extra template variables must be a JSON object");
    for (const auto& [key, value] : options.extra_variables.items()) vars.set(Value(key), convert(value, "variables"));
  }
  jinja::Interpreter interpreter(*tree_, vars, options.limits);
  return interpreter.render();
}

}  // namespace m40::chat
