// A model split by llama.cpp's gguf-split (PREFIX-00001-of-0000N.gguf, the
// metadata in the first part with split.no / split.count /
// split.tensors.count, the tensors spread over the parts) loads from its
// first file as one model: the CPU backend's logits are the unsplit file's,
// bit for bit. A missing part, a later part opened first, or parts of
// another model are refused with a message naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "common/error.h"
#include "gguf/file.h"
#include "gguf/split_name.h"
#include "gguf/writer.h"
#include "model/loaded_model.h"
#include "split_gguf.h"
#include "test_paths.h"

namespace m40 {
namespace {

namespace fs = std::filesystem;

using test::write_split;

std::vector<float> logits_of(const fs::path& path) {
  auto model = model::LoadedModel::open(path.string());
  cpu::CpuBackendOptions o;
  o.n_ctx = 32;
  o.threads = 2;
  cpu::CpuBackend backend(model->hparams, model->weights, o);
  backend::Batch batch;
  for (int i = 0; i < 5; ++i) batch.add(3 + 11 * i, i, 0, true);
  std::vector<float> logits(batch.size() * static_cast<size_t>(backend.n_vocab()));
  backend.forward(batch, logits);
  return logits;
}

class SplitModel : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = test::shared_model("arch/tiny-qwen3-Q8_0.gguf");
    if (!fs::exists(source_)) GTEST_SKIP() << "shared model missing: " << source_;
    dir_ = fs::path(::testing::TempDir()) / ("m40_split_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path source_;
  fs::path dir_;
};

TEST_F(SplitModel, LoadsFromItsFirstFileAsOneModel) {
  write_split(source_, dir_ / "tiny", 3);
  const auto first = dir_ / "tiny-00001-of-00003.gguf";
  const auto file = gguf::File::open(first.string());
  EXPECT_EQ(file.file_count(), 3u);
  uint64_t parts_bytes = 0;
  for (int i = 1; i <= 3; ++i) parts_bytes += fs::file_size(dir_ / gguf::split_file_name("tiny", i, 3));
  EXPECT_EQ(file.total_size(), parts_bytes);
  EXPECT_LT(file.file_size(), parts_bytes);
  EXPECT_EQ(file.tensors().size(), gguf::File::open(source_.string()).tensors().size());
  EXPECT_EQ(logits_of(first), logits_of(source_));
}

TEST_F(SplitModel, AMissingOrWrongPartIsNamed) {
  write_split(source_, dir_ / "tiny", 3);
  auto message = [](const fs::path& p) {
    try {
      gguf::File::open(p.string());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  // A later part opened first: the first is named.
  EXPECT_NE(message(dir_ / "tiny-00002-of-00003.gguf").find("tiny-00001-of-00003.gguf"), std::string::npos);
  // A part gone.
  fs::remove(dir_ / "tiny-00003-of-00003.gguf");
  const std::string missing = message(dir_ / "tiny-00001-of-00003.gguf");
  EXPECT_NE(missing.find("part 3 of 3"), std::string::npos) << missing;
  // A first part whose name does not say it is one.
  fs::rename(dir_ / "tiny-00001-of-00003.gguf", dir_ / "renamed.gguf");
  EXPECT_NE(message(dir_ / "renamed.gguf").find("PREFIX"), std::string::npos);
}

}  // namespace
}  // namespace m40
