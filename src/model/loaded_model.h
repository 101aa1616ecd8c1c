// A model ready to compute with: the mapped GGUF file, its hyperparameters
// and its weight views, kept together so the views never outlive the mapping.
#pragma once

#include <memory>
#include <string>

#include "gguf/file.h"
#include "model/hparams.h"
#include "model/weights.h"

namespace m40::model {

struct LoadedModel {
  gguf::File file;
  ModelHparams hparams;
  ModelWeights weights;

  // Maps and checks the file. Throws m40::Error naming what is wrong
  // (corrupt file, unsupported architecture, missing tensor, bad shape).
  static std::unique_ptr<LoadedModel> open(const std::string& path);

  // e.g. "llama 7B Q4_K_M": architecture, size class and file type.
  std::string description() const;
};

}  // namespace m40::model
