// A copy of a GGUF model with its metadata edited and its tensors unchanged,
// byte for byte: the same weights shipping, say, another chat template
// (tokenizer.chat_template) or another tokenizer flag. For the CLI, server
// and chat tests that need a model which carries a given template.
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "gguf/file.h"
#include "gguf/metadata.h"
#include "gguf/writer.h"

namespace m40::test {

// Writes SOURCE to OUT with EDIT applied to the metadata; returns OUT.
inline std::filesystem::path copy_model(const std::filesystem::path& source, const std::filesystem::path& out,
                                        const std::function<void(gguf::Metadata&)>& edit) {
  const auto file = gguf::File::open(source.string());
  gguf::Writer w(file.alignment());
  for (const auto& [key, value] : file.metadata().entries()) w.metadata().set(key, value);
  if (edit) edit(w.metadata());
  for (const auto& t : file.tensors()) w.add_tensor(t.name, t.type, t.dims, file.tensor_data(t));
  w.write(out.string());  // `file` still maps the tensor data here
  return out;
}

// SOURCE with tokenizer.chat_template set to the text of TEMPLATE_FILE (a
// .jinja file, as a model that ships that template).
inline std::filesystem::path copy_model_with_template(const std::filesystem::path& source,
                                                      const std::filesystem::path& template_file,
                                                      const std::filesystem::path& out) {
  std::ifstream in(template_file, std::ios::binary);
  std::string text(std::istreambuf_iterator<char>(in), {});
  return copy_model(source, out, [&](gguf::Metadata& m) { m.set("tokenizer.chat_template", std::move(text)); });
}

}  // namespace m40::test
