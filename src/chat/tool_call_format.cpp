#include "chat/tool_call_format.h"

#include <cctype>

namespace m40::chat {

namespace {

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

bool is_identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Whether the template reads the variable `tools`: the identifier inside a
// {{ }} or {% %} tag, outside string literals and not as an attribute
// (`message.tools` is another thing). Text such as "<tools>" or "# Tools"
// outside tags, or 'tools' in a literal, does not count.
bool reads_tools_variable(std::string_view src) {
  size_t i = 0;
  while (i + 1 < src.size()) {
    if (src[i] != '{' || (src[i + 1] != '{' && src[i + 1] != '%')) {
      ++i;
      continue;
    }
    const std::string_view close = src[i + 1] == '{' ? "}}" : "%}";
    i += 2;
    while (i < src.size() && src.substr(i, 2) != close) {
      const char c = src[i];
      if (c == '"' || c == '\'') {
        for (++i; i < src.size() && src[i] != c; ++i) {
          if (src[i] == '\\') ++i;
        }
        ++i;
        continue;
      }
      if (is_identifier_char(c)) {
        const size_t start = i;
        while (i < src.size() && is_identifier_char(src[i])) ++i;
        const bool attribute = start > 0 && src[start - 1] == '.';
        if (!attribute && src.substr(start, i - start) == "tools") return true;
        continue;
      }
      ++i;
    }
    i += 2;
  }
  return false;
}

}  // namespace

std::string_view tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::None: return "none";
    case ToolCallFormat::Hermes: return "hermes";
    case ToolCallFormat::Llama3: return "llama3";
    case ToolCallFormat::MistralNemo: return "mistral-nemo";
    case ToolCallFormat::Mistral: return "mistral";
    case ToolCallFormat::DeepSeekV3: return "deepseek-v3";
    case ToolCallFormat::Granite: return "granite";
    case ToolCallFormat::Phi4: return "phi4";
    case ToolCallFormat::Generic: return "generic";
  }
  return "unknown";
}

TemplateTraits template_traits(std::string_view src, const HasToken& has_token) {
  const auto vocab_has = [&](std::string_view token) { return has_token && has_token(token); };
  TemplateTraits traits;
  traits.renders_tools = reads_tools_variable(src);

  if (contains(src, "<think>")) {
    traits.has_thinking = true;
    traits.thinking_open = "<think>";
    traits.thinking_close = "</think>";
  } else if (contains(src, "[THINK]")) {
    traits.has_thinking = true;
    traits.thinking_open = "[THINK]";
    traits.thinking_close = "[/THINK]";
  }

  // Markers first: they name the family even where the definitions are not rendered.
  if (contains(src, "<｜tool▁calls▁begin｜>") || contains(src, "<｜tool▁call▁begin｜>")) {
    traits.tool_format = ToolCallFormat::DeepSeekV3;
  } else if (contains(src, "[TOOL_CALLS]")) {
    traits.tool_format = contains(src, "[ARGS]") || vocab_has("[ARGS]") ? ToolCallFormat::Mistral
                                                                        : ToolCallFormat::MistralNemo;
  } else if (contains(src, "<|tool|>") || contains(src, "<|/tool_call|>")) {
    traits.tool_format = ToolCallFormat::Phi4;
  } else if (contains(src, "<|tool_call|>")) {
    traits.tool_format = ToolCallFormat::Granite;
  } else if (contains(src, "<tool_call>")) {
    traits.tool_format = ToolCallFormat::Hermes;
  } else if (contains(src, "<|start_header_id|>") &&
             (traits.renders_tools || contains(src, "<|python_tag|>") || contains(src, "ipython"))) {
    traits.tool_format = ToolCallFormat::Llama3;
  } else if (traits.renders_tools) {
    if (vocab_has("<tool_call>")) {
      traits.tool_format = ToolCallFormat::Hermes;
    } else if (vocab_has("<｜tool▁calls▁begin｜>")) {
      traits.tool_format = ToolCallFormat::DeepSeekV3;
    } else {
      traits.tool_format = ToolCallFormat::Generic;
    }
  }
  return traits;
}

bool prompt_opens_thinking(const TemplateTraits& traits, std::string_view prompt) {
  if (!traits.has_thinking || traits.thinking_open.empty()) return false;
  while (!prompt.empty() && std::isspace(static_cast<unsigned char>(prompt.back()))) prompt.remove_suffix(1);
  return prompt.ends_with(traits.thinking_open);
}

std::string_view generic_tool_instruction() {
  return "Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` reply to "
         "the user's request";
}

nlohmann::ordered_json with_system_instruction(const nlohmann::ordered_json& messages,
                                               std::string_view instruction) {
  nlohmann::ordered_json out = messages.is_array() ? messages : nlohmann::ordered_json::array();
  if (!out.empty() && out[0].is_object() && out[0].value("role", "") == "system" && out[0].contains("content") &&
      out[0]["content"].is_string()) {
    out[0]["content"] = out[0]["content"].get<std::string>() + "\n\n" + std::string(instruction);
  } else {
    out.insert(out.begin(), nlohmann::ordered_json{{"role", "system"}, {"content", std::string(instruction)}});
  }
  return out;
}

}  // namespace m40::chat
