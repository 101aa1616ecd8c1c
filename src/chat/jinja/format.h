// Python's three text formatters as templates reach them: `str % args`
// (printf style, also the |format filter), str.format(...), and
// datetime.strftime (behind transformers' strftime_now).
#pragma once

#include <string>

#include "chat/jinja/value.h"

namespace m40::chat {

// A calendar date and time, as strftime_now sees "now".
struct DateTime {
  int year = 1970;
  int month = 1;  // 1..12
  int day = 1;    // 1..31
  int hour = 0;
  int minute = 0;
  int second = 0;
};

// The machine's local time (Python's datetime.now()).
DateTime local_now();

// Python datetime.strftime for a naive datetime: %z and %Z give "", %f gives
// "000000", everything else is C strftime in the "C" locale.
std::string strftime(const std::string& format, const DateTime& time);

namespace jinja {

// Python `format % args`: args is a tuple of values, a dict for %(name)s
// conversions, or one value.
std::string percent_format(const std::string& format, const Value& args);

// Python str.format(*positional, **keyword); fields look attributes and
// items up the way Jinja2's sandboxed formatter does.
std::string brace_format(const std::string& format, const CallArgs& args);

// format(value, spec) for one value.
std::string format_value(const Value& value, const std::string& spec);

}  // namespace jinja
}  // namespace m40::chat
