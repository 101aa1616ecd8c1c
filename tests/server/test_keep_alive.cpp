// Ollama's keep_alive values: duration strings, seconds, 0 and negatives.
#include <gtest/gtest.h>

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
