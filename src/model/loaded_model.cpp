#include "model/loaded_model.h"

#include <cmath>

#include "model/model_summary.h"

namespace m40::model {

std::unique_ptr<LoadedModel> LoadedModel::open(const std::string& path) {
  gguf::File file = gguf::File::open(path);
  ModelHparams hparams = ModelHparams::from_file(file);
  ModelWeights weights = ModelWeights::load(file, hparams);
  return std::unique_ptr<LoadedModel>(new LoadedModel{std::move(file), std::move(hparams), std::move(weights)});
}

std::string LoadedModel::description() const {
  uint64_t params = 0;
  for (const auto& t : file.tensors()) params += t.element_count;
  // Like llama-bench, sizes are named sizes by the nearest whole billion ("?B" under 1B).
  const double billions = static_cast<double>(params) / 1e9;
  const std::string size = billions < 1.0 ? "?B" : std::to_string(static_cast<int>(std::lround(billions))) + "B";
  std::string type = "?";
  if (auto ft = file.metadata().get_optional<uint32_t>("general.file_type")) {
    if (auto name = file_type_name(*ft)) type = name->rfind("MOSTLY_", 0) == 0 ? name->substr(7) : *name;
  }
  return hparams.architecture + " " + size + " " + type;
}

}  // namespace m40::model
