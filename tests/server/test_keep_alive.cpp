// Ollama's keep_alive values: duration strings, seconds, 0 and negatives.
#include <gtest/gtest.h>

#include <limits>

#include "common/error.h"
#include "server/keep_alive.h"

using m40::server::keep_alive_field;
using m40::server::parse_keep_alive;
using namespace std::chrono_literals;

TEST(KeepAlive, DurationStringsAsGoWritesThem) {
  EXPECT_EQ(parse_keep_alive("5m").duration, 5min);
  EXPECT_EQ(parse_keep_alive("1h30m").duration, 90min);
  EXPECT_EQ(parse_keep_alive("90s").duration, 90s);
  EXPECT_EQ(parse_keep_alive("2.5s").duration, 2500ms);
  EXPECT_EQ(parse_keep_alive("500ms").duration, 500ms);
  EXPECT_FALSE(parse_keep_alive("5m").forever);
}

TEST(KeepAlive, NumbersAreSecondsZeroUnloadsNegativeIsForever) {
  EXPECT_EQ(parse_keep_alive("300").duration, 300s);
  EXPECT_TRUE(parse_keep_alive("0").unload_at_once());
  EXPECT_TRUE(parse_keep_alive("0s").unload_at_once());
  EXPECT_TRUE(parse_keep_alive("-1").forever);
  EXPECT_TRUE(parse_keep_alive("-1m").forever);
  EXPECT_FALSE(parse_keep_alive("-1").unload_at_once());
}

TEST(KeepAlive, TheRequestFieldTakesStringsAndNumbers) {
  using json = nlohmann::ordered_json;
  EXPECT_FALSE(keep_alive_field(json::object()).has_value());
  EXPECT_FALSE(keep_alive_field(json{{"keep_alive", nullptr}}).has_value());
  EXPECT_EQ(keep_alive_field(json{{"keep_alive", 30}})->duration, 30s);
  EXPECT_EQ(keep_alive_field(json{{"keep_alive", "10m"}})->duration, 10min);
  EXPECT_TRUE(keep_alive_field(json{{"keep_alive", -5}})->forever);
  EXPECT_THROW(keep_alive_field(json{{"keep_alive", true}}), m40::Error);
}

TEST(KeepAlive, AnythingElseIsAnErrorNamingTheForms) {
  for (const char* bad : {"", "soon", "5x", "m", "1h-5m", "5 m"}) {
    try {
      parse_keep_alive(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const m40::Error& e) {
      EXPECT_NE(std::string(e.what()).find("\"5m\""), std::string::npos) << e.what();
    }
  }
}

// NaN used to round to a negative duration and unload the model at once;
// "inf" is no duration either.
TEST(KeepAlive, NonFiniteValuesAreRefused) {
  for (const char* bad : {"nan", "NaN", "-nan", "inf", "-inf", "Infinity", "infs", "nanm", "1e400"}) {
    EXPECT_THROW(parse_keep_alive(bad), m40::Error) << bad;
  }
  using json = nlohmann::ordered_json;
  EXPECT_THROW(keep_alive_field(json{{"keep_alive", std::numeric_limits<double>::quiet_NaN()}}), m40::Error);
  EXPECT_THROW(keep_alive_field(json{{"keep_alive", std::numeric_limits<double>::infinity()}}), m40::Error);
  EXPECT_THROW(keep_alive_field(json{{"keep_alive", "nan"}}), m40::Error);
}

// Centuries overflowed steady_clock::now() + duration into the past, which
// unloaded the model at once; past the bound a duration means forever.
TEST(KeepAlive, DurationsPastTheBoundNeverExpire) {
  using json = nlohmann::ordered_json;
  EXPECT_TRUE(parse_keep_alive("1e10").forever);     // 317 years
  EXPECT_TRUE(parse_keep_alive("1e300h").forever);
  EXPECT_TRUE(parse_keep_alive("1e308h").forever);   // seconds overflow to inf
  EXPECT_TRUE(keep_alive_field(json{{"keep_alive", 1e10}})->forever);
  EXPECT_TRUE(keep_alive_field(json{{"keep_alive", 4294967296000}})->forever);
  EXPECT_FALSE(parse_keep_alive("1e10").unload_at_once());

  // Up to the bound the duration is kept, and both clocks can add it.
  const auto longest = parse_keep_alive("999999999");
  EXPECT_FALSE(longest.forever);
  EXPECT_EQ(longest.duration, std::chrono::seconds(999999999));
  EXPECT_GT(std::chrono::steady_clock::now() + longest.duration, std::chrono::steady_clock::now());
  EXPECT_GT(std::chrono::system_clock::now() + longest.duration, std::chrono::system_clock::now());
  EXPECT_EQ(parse_keep_alive("8760h").duration, std::chrono::hours(8760));
}
