// Choosing the GGUF file of a Hugging Face repository by quantization, and
// reading pull references.
#include <gtest/gtest.h>

#include "common/error.h"
#include "gguf/split_name.h"
#include "store/huggingface.h"
#include "store/pull.h"
#include "test_paths.h"

namespace {

using m40::store::HfFile;
using m40::store::select_gguf;

const char* kTree = R"([
  {"type": "directory", "oid": "x", "size": 0, "path": "sub"},
  {"type": "file", "oid": "a", "size": 1519, "path": "README.md"},
  {"type": "file", "oid": "b", "size": 134,
   "lfs": {"oid": "5a798ebc1cad921e0ce639b2f10c4bcce492654a79d4b4ca52bd0268416f6b87", "size": 553120, "pointerSize": 134},
   "path": "TinyStories-656K-Q2_K.gguf"},
  {"type": "file", "oid": "c", "size": 749728, "path": "TinyStories-656K-Q8_0.gguf"}
])";

std::vector<HfFile> files(std::initializer_list<const char*> paths) {
  std::vector<HfFile> out;
  for (const char* p : paths) out.push_back(HfFile{p, 1, std::nullopt});
  return out;
}

TEST(HuggingFace, ParsesTheTreeListing) {
  const auto listing = m40::store::parse_hf_tree(kTree);
  ASSERT_EQ(listing.size(), 3u);
  EXPECT_EQ(listing[1].path, "TinyStories-656K-Q2_K.gguf");
  EXPECT_EQ(listing[1].size, 553120u);  // the LFS size, not the pointer's
  EXPECT_EQ(listing[1].sha256, "5a798ebc1cad921e0ce639b2f10c4bcce492654a79d4b4ca52bd0268416f6b87");
  EXPECT_FALSE(listing[2].sha256.has_value());
  EXPECT_THROW(m40::store::parse_hf_tree("{not json"), m40::Error);
}

TEST(HuggingFace, SelectsTheQuantizationCaseInsensitively) {
  const auto listing = m40::store::parse_hf_tree(kTree);
  EXPECT_EQ(select_gguf(listing, "q8_0", "r").path, "TinyStories-656K-Q8_0.gguf");
  EXPECT_EQ(select_gguf(listing, "Q2_K", "r").path, "TinyStories-656K-Q2_K.gguf");
}

TEST(HuggingFace, DefaultsToQ4_K_MAndPrefersTheExactToken) {
  const auto listing = files({"m.Q4_K_S.gguf", "m.Q4_K_M.gguf", "m.Q4_K.gguf", "mmproj-m-Q4_K_M.gguf"});
  EXPECT_EQ(select_gguf(listing, "", "r").path, "m.Q4_K_M.gguf");
  EXPECT_EQ(select_gguf(listing, "q4_k", "r").path, "m.Q4_K.gguf");
}

TEST(HuggingFace, TheOnlyGgufWhenNoQuantizationIsAsked) {
  EXPECT_EQ(select_gguf(files({"README.md", "model-f16.gguf"}), "", "r").path, "model-f16.gguf");
}

TEST(HuggingFace, NoMatchListsWhatThereIs) {
  try {
    select_gguf(m40::store::parse_hf_tree(kTree), "Q5_K_M", "hf.co/a/b");
    FAIL();
  } catch (const m40::Error& e) {
    EXPECT_STREQ(e.what(), "no Q5_K_M GGUF file in hf.co/a/b; it has: Q2_K, Q8_0");
  }
  EXPECT_THROW(select_gguf(files({"README.md"}), "", "r"), m40::Error);
}

// A listed path's place among a split model's parts (gguf/split_name.h).
TEST(HuggingFace, ReadsWhereASplitPartStands) {
  const auto parse_split_part = m40::gguf::parse_split_file_name;
  const auto part = parse_split_part("Q4_K_M/M-Q4_K_M-00002-of-00003.gguf");
  ASSERT_TRUE(part.has_value());
  EXPECT_EQ(part->prefix, "Q4_K_M/M-Q4_K_M");
  EXPECT_EQ(part->number, 2u);
  EXPECT_EQ(part->count, 3u);
  EXPECT_FALSE(parse_split_part("M-Q4_K_M.gguf").has_value());
  EXPECT_FALSE(parse_split_part("M-00004-of-00003.gguf").has_value());  // no such part
  EXPECT_FALSE(parse_split_part("M-00000-of-00003.gguf").has_value());
  EXPECT_FALSE(parse_split_part("M-0001-of-0003.gguf").has_value());   // not gguf-split's digits
  EXPECT_FALSE(parse_split_part("-00001-of-00003.gguf").has_value());  // no prefix
}

TEST(HuggingFace, ASplitModelComesBackWithEveryPartInOrder) {
  const auto listing = files({"README.md", "Q8_0/m-Q8_0-00002-of-00003.gguf", "Q8_0/m-Q8_0-00001-of-00003.gguf",
                              "Q8_0/m-Q8_0-00003-of-00003.gguf", "m-Q2_K.gguf"});
  const HfFile chosen = select_gguf(listing, "q8_0", "r");
  const auto parts = m40::store::model_files(listing, chosen, "r");
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].path, "Q8_0/m-Q8_0-00001-of-00003.gguf");
  EXPECT_EQ(parts[1].path, "Q8_0/m-Q8_0-00002-of-00003.gguf");
  EXPECT_EQ(parts[2].path, "Q8_0/m-Q8_0-00003-of-00003.gguf");
  // A file that is no part is itself.
  const auto single = m40::store::model_files(listing, select_gguf(listing, "Q2_K", "r"), "r");
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(single[0].path, "m-Q2_K.gguf");
}

TEST(HuggingFace, OneFileIsPreferredToSplitParts) {
  const auto listing = files({"m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf", "sub/m-Q8_0.gguf"});
  EXPECT_EQ(select_gguf(listing, "Q8_0", "r").path, "sub/m-Q8_0.gguf");
}

TEST(HuggingFace, ASplitModelWithAPartMissingNamesIt) {
  const auto listing = files({"m-Q8_0-00001-of-00003.gguf", "m-Q8_0-00003-of-00003.gguf"});
  try {
    m40::store::model_files(listing, select_gguf(listing, "Q8_0", "hf.co/a/b"), "hf.co/a/b");
    FAIL();
  } catch (const m40::Error& e) {
    EXPECT_STREQ(e.what(), "the model m-Q8_0-00001-of-00003.gguf in hf.co/a/b is split into 3 files, but part 2 of 3 "
                           "(m-Q8_0-00002-of-00003.gguf) is not there");
  }
}

TEST(HuggingFace, TheNextPageComesFromTheLinkHeader) {
  using m40::store::next_page_url;
  const std::string here = "https://huggingface.co/api/models/o/r/tree/main?recursive=true";
  EXPECT_EQ(next_page_url(R"(<https://huggingface.co/api/models/o/r/tree/main?recursive=true&cursor=ZXlK>; rel="next")", here),
            "https://huggingface.co/api/models/o/r/tree/main?recursive=true&cursor=ZXlK");
  // Several links, the next one second; a relative target; rel with two types.
  EXPECT_EQ(next_page_url(R"(<https://x/a?p=1>; rel="prev", </api/b?c=2,3>; rel="next")", here),
            "https://huggingface.co/api/b?c=2,3");
  EXPECT_EQ(next_page_url(R"(<https://x/n>; REL="next last")", here), "https://x/n");
  EXPECT_EQ(next_page_url(R"(<https://x/p>; rel="prev")", here), std::nullopt);
  EXPECT_EQ(next_page_url(R"(<https://x/p>; rel="nextish")", here), std::nullopt);
  EXPECT_EQ(next_page_url("", here), std::nullopt);
}

TEST(PullRef, Kinds) {
  using m40::store::parse_pull_ref;
  using m40::store::SourceKind;
  auto url = parse_pull_ref("https://example.com/models/Tiny-Q8_0.gguf?download=1");
  EXPECT_EQ(url.kind, SourceKind::Url);
  EXPECT_EQ(url.default_name.str(), "tiny-q8_0:latest");

  auto repo = parse_pull_ref("hf.co/Org/Repo-GGUF:q8_0");
  EXPECT_EQ(repo.kind, SourceKind::HuggingFaceRepo);
  EXPECT_EQ(repo.org, "Org");
  EXPECT_EQ(repo.repo, "Repo-GGUF");
  EXPECT_EQ(repo.quant, "q8_0");
  EXPECT_EQ(repo.default_name.str(), "hf.co/Org/Repo-GGUF:q8_0");
  EXPECT_EQ(parse_pull_ref("hf.co/Org/Repo").default_name.str(), "hf.co/Org/Repo:latest");
  // The store name of that pull, pulled again, means the default quantization.
  auto latest = parse_pull_ref("hf.co/Org/Repo:latest");
  EXPECT_EQ(latest.quant, "");
  EXPECT_EQ(latest.default_name.str(), "hf.co/Org/Repo:latest");

  auto file = parse_pull_ref("Org/Repo/sub/Model.Q4_K_M.gguf");
  EXPECT_EQ(file.kind, SourceKind::HuggingFaceFile);
  EXPECT_EQ(file.file, "sub/Model.Q4_K_M.gguf");
  EXPECT_EQ(file.default_name.str(), "hf.co/Org/Repo:Q4_K_M");

  const auto local = m40::test::shared_model("TinyStories-656K-Q8_0.gguf").string();
  auto path = parse_pull_ref(local);
  EXPECT_EQ(path.kind, SourceKind::LocalFile);
  EXPECT_EQ(path.default_name.str(), "tinystories-656k-q8_0:latest");

  EXPECT_THROW(parse_pull_ref("a/b/c"), m40::Error);  // "tinystories" is an Ollama name: test_ollama.cpp
  EXPECT_THROW(parse_pull_ref("/no/such/file.gguf"), m40::Error);
  EXPECT_THROW(parse_pull_ref("hf.co/onlyorg"), m40::Error);
}

}  // namespace
