// Token masks on real vocabularies (Qwen2's 151k byte-level BPE tokens and
// Llama's 32k SentencePiece tokens): JSON documents tokenized by the
// vocabulary pass token by token, masks equal the brute-force answer, and
// random walks through schema grammars always produce JSON the schema accepts.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "grammar/token_constraint.h"
#include "grammar_test_util.h"

namespace m40::grammar {
namespace {

using json = nlohmann::ordered_json;

const char* const kPersonSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user", "guest"]},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
    "active": {"type": "boolean"},
    "bio": {"type": "string", "maxLength": 40}
  },
  "required": ["name", "age", "role", "tags"],
  "additionalProperties": false
})";

const char* const kOrderSchema = R"({
  "$defs": {
    "item": {
      "type": "object",
      "properties": {
        "id": {"type": "integer"},
        "price": {"type": "number", "minimum": 0, "maximum": 1000},
        "kind": {"const": "book"}
      },
      "required": ["id", "kind"]
    }
  },
  "type": "object",
  "properties": {
    "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 3},
    "note": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
    "when": {"type": "string", "format": "date"}
  },
  "required": ["items", "when"]
})";

const char* const kTreeSchema = R"({
  "$ref": "#/$defs/node",
  "$defs": {
    "node": {
      "type": "object",
      "properties": {
        "v": {"type": "integer", "minimum": -5, "maximum": 5},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}
      },
      "required": ["v"]
    }
  }
})";

size_t codepoints(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

void validate_person(const json& v) {
  ASSERT_TRUE(v.is_object());
  for (auto it = v.begin(); it != v.end(); ++it) {
    EXPECT_TRUE(it.key() == "name" || it.key() == "age" || it.key() == "role" || it.key() == "tags" || it.key() == "active" ||
                it.key() == "bio")
        << it.key();
  }
  ASSERT_TRUE(v.contains("name") && v.contains("age") && v.contains("role") && v.contains("tags"));
  ASSERT_TRUE(v["name"].is_string());
  EXPECT_LE(codepoints(v["name"].get<std::string>()), 12u);
  ASSERT_TRUE(v["age"].is_number_integer());
  EXPECT_GE(v["age"].get<int>(), 0);
  EXPECT_LE(v["age"].get<int>(), 120);
  EXPECT_TRUE(v["role"] == "admin" || v["role"] == "user" || v["role"] == "guest") << v["role"];
  ASSERT_TRUE(v["tags"].is_array());
  EXPECT_GE(v["tags"].size(), 1u);
  EXPECT_LE(v["tags"].size(), 3u);
  for (const json& t : v["tags"]) EXPECT_TRUE(t == "a" || t == "b" || t == "c") << t;
  if (v.contains("active")) {
    EXPECT_TRUE(v["active"].is_boolean());
  }
  if (v.contains("bio")) {
    ASSERT_TRUE(v["bio"].is_string());
    EXPECT_LE(codepoints(v["bio"].get<std::string>()), 40u);
  }
}

void validate_order(const json& v) {
  ASSERT_TRUE(v.is_object());
  ASSERT_TRUE(v.contains("items") && v.contains("when"));
  ASSERT_TRUE(v["items"].is_array());
  EXPECT_LE(v["items"].size(), 3u);
  for (const json& item : v["items"]) {
    ASSERT_TRUE(item.is_object());
    ASSERT_TRUE(item.contains("id") && item["id"].is_number_integer());
    EXPECT_EQ(item["kind"], "book");
    if (item.contains("price")) {
      ASSERT_TRUE(item["price"].is_number());
      EXPECT_GE(item["price"].get<double>(), 0.0);
      EXPECT_LE(item["price"].get<double>(), 1000.0);
    }
    EXPECT_LE(item.size(), 3u);
  }
  if (v.contains("note")) {
    EXPECT_TRUE(v["note"].is_null() || (v["note"].is_string() && codepoints(v["note"].get<std::string>()) <= 8));
  }
  ASSERT_TRUE(v["when"].is_string());
  const std::string when = v["when"].get<std::string>();
  ASSERT_EQ(when.size(), 10u) << when;
  EXPECT_TRUE(when[4] == '-' && when[7] == '-') << when;
  const int month = std::stoi(when.substr(5, 2)), day = std::stoi(when.substr(8, 2));
  EXPECT_TRUE(month >= 1 && month <= 12 && day >= 1 && day <= 31) << when;
  EXPECT_LE(v.size(), 3u);
}

void validate_tree(const json& v) {
  ASSERT_TRUE(v.is_object());
  ASSERT_TRUE(v.contains("v") && v["v"].is_number_integer());
  EXPECT_GE(v["v"].get<int>(), -5);
  EXPECT_LE(v["v"].get<int>(), 5);
  if (v.contains("kids")) {
    ASSERT_TRUE(v["kids"].is_array());
    EXPECT_LE(v["kids"].size(), 2u);
    for (const json& k : v["kids"]) validate_tree(k);
  }
}

class ConstraintOnVocabulary : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    loaded_ = test::load_vocab(GetParam());
    if (loaded_ == nullptr) GTEST_SKIP() << "vocabulary " << GetParam() << " not found in shared/models/vocab";
  }
  const TokenVocabulary& vocab() const { return *loaded_->vocab; }

  // Feeds `doc` as the vocabulary tokenizes it; every token must be allowed
  // and kept by the mask; at the end only completion may follow.
  void accept_document(const std::string& gbnf, const std::string& doc, int brute_force_every = 0) {
    auto g = parse_gbnf(gbnf);
    const std::vector<int32_t> ids = test::continuation_tokens(*loaded_, doc);
    ASSERT_FALSE(ids.empty()) << "could not tokenize " << doc;
    TokenConstraint c(g, loaded_->vocab);
    GrammarMatcher matcher(g);
    std::vector<float> logits(vocab().size());
    for (size_t i = 0; i < ids.size(); ++i) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      c.mask(logits);
      ASSERT_TRUE(c.allows(ids[i])) << "token " << i << " '" << vocab().piece(ids[i]) << "' of " << doc;
      ASSERT_EQ(logits[static_cast<size_t>(ids[i])], 0.0f) << "the mask removed token " << i << " of " << doc;
      ASSERT_FALSE(c.finished());
      if (brute_force_every > 0 && i % static_cast<size_t>(brute_force_every) == 0) {
        // The mask against a copy of the matcher fed each token's bytes.
        for (size_t t = 0; t < vocab().size(); ++t) {
          const auto id = static_cast<int32_t>(t);
          const bool want = vocab().is_end_of_generation(id) ? matcher.can_end()
                                                              : !vocab().piece(id).empty() && matcher.allows(vocab().piece(id));
          ASSERT_EQ(!std::isinf(logits[t]), want) << "token " << t << " '" << vocab().piece(id) << "' at token " << i;
        }
      }
      c.accept(ids[i]);
      ASSERT_TRUE(matcher.accept(vocab().piece(ids[i])));
    }
    EXPECT_TRUE(c.can_end());
    EXPECT_TRUE(c.finished()) << "a whole JSON value: nothing may follow";
    const int32_t eog = vocab().end_of_generation().front();
    EXPECT_TRUE(c.allows(eog));
    c.accept(eog);
    EXPECT_TRUE(c.finished());
  }

  // Random walks: pick an allowed token (half of the time one that closes
  // something), until the grammar ends or 300 tokens; the text must parse.
  template <typename Validate>
  void random_walks(const std::string& gbnf, int seeds, Validate validate) {
    auto g = parse_gbnf(gbnf);
    std::vector<float> logits(vocab().size());
    for (int seed = 0; seed < seeds; ++seed) {
      std::mt19937 rng(static_cast<uint32_t>(seed) * 7919u + 17u);
      TokenConstraint c(g, loaded_->vocab);
      std::string text;
      bool ended = false;
      for (int step = 0; step < 300 && !ended; ++step) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        c.mask(logits);
        std::vector<int32_t> allowed, closers;
        for (size_t t = 0; t < logits.size(); ++t) {
          if (std::isinf(logits[t])) continue;
          const auto id = static_cast<int32_t>(t);
          allowed.push_back(id);
          const std::string& p = vocab().piece(id);
          if (vocab().is_end_of_generation(id) || p.find_first_of("\"}]") != std::string::npos) closers.push_back(id);
        }
        ASSERT_FALSE(allowed.empty()) << "dead end after " << text;
        const auto& pool = (!closers.empty() && rng() % 2 == 0) ? closers : allowed;
        const int32_t pick = pool[rng() % pool.size()];
        ASSERT_TRUE(c.allows(pick));
        c.accept(pick);
        if (vocab().is_end_of_generation(pick)) {
          ended = true;
        } else {
          text += vocab().piece(pick);
        }
      }
      ASSERT_TRUE(ended) << "seed " << seed << ": no end within 300 tokens: " << text;
      json value;
      ASSERT_NO_THROW(value = json::parse(text)) << "seed " << seed << ": " << text;
      SCOPED_TRACE("seed " + std::to_string(seed) + ": " + text);
      validate(value);
    }
  }

  const test::LoadedVocab* loaded_ = nullptr;
};

TEST_P(ConstraintOnVocabulary, JsonDocumentsPassTokenByToken) {
  const std::string any_object = json_object_gbnf();
  accept_document(any_object, R"({"name": "Alice", "tags": ["x", "y"], "n": -12.5e3, "ok": true, "z": null})", 7);
  accept_document(any_object, "{\n  \"nested\": {\"deep\": [[1, 2], {\"k\": \"v\\\"q\\u00e9\"}]},\n  \"unicode\": \"héllo 世界 🦙\"\n}", 11);
  accept_document(json_schema_to_gbnf(json::parse(kPersonSchema)),
                  R"({"name": "Bob", "age": 42, "role": "admin", "tags": ["a", "c"], "active": false})", 5);
  accept_document(json_schema_to_gbnf(json::parse(kOrderSchema)),
                  R"({"items": [{"id": 1, "price": 12.5, "kind": "book"}, {"id": 2, "kind": "book"}], "note": null, "when": "2024-02-29"})", 9);
}

TEST_P(ConstraintOnVocabulary, MaskEqualsPlainReferenceMatcher) {
  // The independent reference (explicit stacks, no memo), on a few states.
  auto g = parse_gbnf(json_schema_to_gbnf(json::parse(kOrderSchema)));
  const std::string doc = R"({"items": [{"id": 7, "kind": "book"}], "note": "hi", "when": "2024-01-05"})";
  const std::vector<int32_t> ids = test::continuation_tokens(*loaded_, doc);
  ASSERT_FALSE(ids.empty());
  TokenConstraint c(g, loaded_->vocab);
  test::ReferenceMatcher ref(*g);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % 6 == 0) {
      const auto bits = c.allowed_bits();
      for (size_t t = 0; t < vocab().size(); ++t) {
        const auto id = static_cast<int32_t>(t);
        const bool want = vocab().is_end_of_generation(id) ? ref.can_end()
                                                            : !vocab().piece(id).empty() && ref.accepts(vocab().piece(id));
        ASSERT_EQ(((bits[t / 64] >> (t % 64)) & 1) != 0, want) << "token " << t << " '" << vocab().piece(id) << "' at " << i;
      }
    }
    c.accept(ids[i]);
    ref.advance(vocab().piece(ids[i]));
  }
}

TEST_P(ConstraintOnVocabulary, LengthLimitsHoldToTheCharacter) {
  // maxLength 40 runs as a counted loop; the reference runs 40 copies.
  auto g = parse_gbnf(json_schema_to_gbnf(json::parse(R"({"type": "object", "properties": {"s": {"type": "string", "maxLength": 40}},
                                                         "required": ["s"]})")));
  ASSERT_FALSE(g->automaton().loops.empty());
  const std::string forty = R"(Zoë wrote \"forty\" chars, exactly! 🦙.....)";  // JSON string content: 40 characters decoded
  ASSERT_EQ(codepoints(json::parse("\"" + forty + "\"").get<std::string>()), 40u);
  for (const std::string& s : {forty, forty.substr(0, 20), std::string("x") + forty}) {
    const std::string doc = "{\"s\": \"" + s + "\"}";
    const std::vector<int32_t> ids = test::continuation_tokens(*loaded_, doc);
    ASSERT_FALSE(ids.empty());
    TokenConstraint c(g, loaded_->vocab);
    test::ReferenceMatcher ref(*g);
    bool refused = false;
    for (size_t i = 0; i < ids.size() && !refused; ++i) {
      if (i >= 3 && (i % 3 == 0 || i + 4 >= ids.size())) {  // in the string, densely near its end: against the reference
        const auto bits = c.allowed_bits();
        for (size_t t = 0; t < vocab().size(); ++t) {
          const auto id = static_cast<int32_t>(t);
          const bool want = vocab().is_end_of_generation(id) ? ref.can_end()
                                                              : !vocab().piece(id).empty() && ref.accepts(vocab().piece(id));
          ASSERT_EQ(((bits[t / 64] >> (t % 64)) & 1) != 0, want) << "token '" << vocab().piece(id) << "' at " << i << " of " << doc;
        }
      }
      refused = !c.allows(ids[i]);
      if (!refused) {
        c.accept(ids[i]);
        ref.advance(vocab().piece(ids[i]));
      }
    }
    EXPECT_EQ(refused, s.size() > forty.size()) << doc;
    if (!refused) {
      EXPECT_TRUE(c.finished()) << doc;
    }
  }
}

TEST_P(ConstraintOnVocabulary, RandomWalksGivePersonsTheSchemaAccepts) {
  random_walks(json_schema_to_gbnf(json::parse(kPersonSchema)), 12, validate_person);
}

TEST_P(ConstraintOnVocabulary, RandomWalksGiveOrdersTheSchemaAccepts) {
  random_walks(json_schema_to_gbnf(json::parse(kOrderSchema)), 12, validate_order);
}

TEST_P(ConstraintOnVocabulary, RandomWalksGiveRecursiveTrees) {
  random_walks(json_schema_to_gbnf(json::parse(kTreeSchema)), 12, validate_tree);
}

TEST_P(ConstraintOnVocabulary, RandomWalksGiveJsonObjects) {
  random_walks(json_object_gbnf(), 12, [](const json& v) { EXPECT_TRUE(v.is_object()); });
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, ConstraintOnVocabulary, testing::Values("qwen2", "llama-spm"),
                         [](const testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace m40::grammar
