#include "chat/jinja/format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <ctime>
#include <vector>

#include "chat/jinja/builtins.h"
#include "chat/jinja/python.h"
#include "chat/jinja/unicode.h"

namespace m40::chat {

// ------------------------------------------------------------ strftime

namespace {

// Days since 1970-01-01 of a proleptic Gregorian date.
int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2 ? 1 : 0;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

}  // namespace

DateTime local_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  return DateTime{tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec};
}

std::string strftime(const std::string& format, const DateTime& t) {
  // Python replaces %z, %Z and %f itself before calling the C library.
  std::string fmt;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] == '%' && i + 1 < format.size()) {
      const char c = format[i + 1];
      if (c == 'z' || c == 'Z') {
        ++i;
        continue;
      }
      if (c == 'f') {
        fmt += "000000";
        ++i;
        continue;
      }
      fmt.push_back('%');
      fmt.push_back(c);
      ++i;
      continue;
    }
    fmt.push_back(format[i]);
  }
  std::tm tm{};
  tm.tm_year = t.year - 1900;
  tm.tm_mon = t.month - 1;
  tm.tm_mday = t.day;
  tm.tm_hour = t.hour;
  tm.tm_min = t.minute;
  tm.tm_sec = t.second;
  const int64_t days = days_from_civil(t.year, static_cast<unsigned>(t.month), static_cast<unsigned>(t.day));
  tm.tm_wday = static_cast<int>(((days % 7) + 7 + 4) % 7);  // 1970-01-01 was a Thursday
  tm.tm_yday = static_cast<int>(days - days_from_civil(t.year, 1, 1));
  tm.tm_isdst = -1;
  if (fmt.empty()) return "";
  // strftime returns 0 both for "too small" and for an empty result; a
  // marker character tells them apart.
  fmt.push_back('\x01');
  std::vector<char> buf(256);
  while (true) {
    const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
    if (n > 0) return std::string(buf.data(), n - 1);
    if (buf.size() > (1u << 20)) return "";
    buf.resize(buf.size() * 4);
  }
}

namespace jinja {

namespace {

// ------------------------------------------------------------ format specs

struct Spec {
  char fill = ' ';
  char align = 0;  // < > ^ =
  char sign = '-';
  bool alternate = false;
  bool zero = false;
  int width = -1;
  char grouping = 0;
  int precision = -1;
  char type = 0;
};

// The largest width or precision a format spec may ask for. Python allows
// any, but a template from a model file could otherwise make snprintf or the
// padding build gigabytes before the output limit sees them; no real chat
// template pads or rounds to anywhere near this.
constexpr int kMaxFormatField = 4096;

[[noreturn]] void field_too_large(const char* what) {
  throw Failure(std::string("format ") + what + " too large (the limit is " + std::to_string(kMaxFormatField) + ")");
}

// Reads the decimal digits at text[i...] as a width or precision, refusing
// (before the int could overflow) any value above kMaxFormatField.
int read_field(std::string_view text, size_t& i, const char* what) {
  int value = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    value = value * 10 + (text[i++] - '0');
    if (value > kMaxFormatField) field_too_large(what);
  }
  return value;
}

// A width or precision given by a '*' argument, within the same bound.
int star_field(const Value& v, const char* what) {
  if (!v.is_integral()) throw Failure("* wants int");
  const int64_t n = v.as_integral();
  if (n > kMaxFormatField || n < -kMaxFormatField) field_too_large(what);
  return static_cast<int>(n);
}

std::string pad(std::string body, const Spec& s, char default_align) {
  const size_t len = unicode::length(body);
  if (s.width < 0 || len >= static_cast<size_t>(s.width)) return body;
  const size_t fill = static_cast<size_t>(s.width) - len;
  const char align = s.align ? s.align : default_align;
  if (align == '<') return body + std::string(fill, s.fill);
  if (align == '^') return std::string(fill / 2, s.fill) + body + std::string(fill - fill / 2, s.fill);
  if (align == '=') {
    size_t sign_len = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
    if (body.size() > sign_len + 1 && body[sign_len] == '0' && (body[sign_len + 1] | 0x20) == 'x') sign_len += 2;
    return body.substr(0, sign_len) + std::string(fill, s.fill) + body.substr(sign_len);
  }
  return std::string(fill, s.fill) + body;
}

std::string group_thousands(const std::string& digits, char sep) {
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out.push_back(sep);
    out.push_back(digits[i]);
  }
  return out;
}

std::string format_int(int64_t v, const Spec& s) {
  char type = s.type ? s.type : 'd';
  const bool negative = v < 0;
  const uint64_t mag = negative ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  std::string digits;
  std::string prefix;
  char buf[80];
  switch (type) {
    case 'd': case 'n': std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(mag)); digits = buf; break;
    case 'x': std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(mag)); digits = buf; prefix = "0x"; break;
    case 'X': std::snprintf(buf, sizeof buf, "%llX", static_cast<unsigned long long>(mag)); digits = buf; prefix = "0X"; break;
    case 'o': std::snprintf(buf, sizeof buf, "%llo", static_cast<unsigned long long>(mag)); digits = buf; prefix = "0o"; break;
    case 'b': {
      uint64_t m = mag;
      do {
        digits.insert(digits.begin(), static_cast<char>('0' + (m & 1)));
        m >>= 1;
      } while (m != 0);
      prefix = "0b";
      break;
    }
    case 'c': {
      std::string out;
      unicode::append(out, static_cast<char32_t>(v));
      return pad(out, s, '<');
    }
    default:
      throw Failure(std::string("Unknown format code '") + type + "' for object of type 'int'");
  }
  if (s.grouping) digits = group_thousands(digits, s.grouping);
  std::string sign = negative ? "-" : (s.sign == '+' ? "+" : s.sign == ' ' ? " " : "");
  std::string head = sign + (s.alternate ? prefix : "");
  if (s.zero && !s.align && s.width > 0) {
    const auto total = static_cast<size_t>(s.width);
    if (head.size() + digits.size() < total) digits.insert(0, total - head.size() - digits.size(), '0');
  }
  return pad(head + digits, s, '>');
}

std::string format_float(double v, const Spec& s) {
  char type = s.type;
  std::string body;
  if (std::isinf(v) || std::isnan(v)) {
    body = std::isnan(v) ? "nan" : (v < 0 ? "-inf" : "inf");
    if (type == 'F' || type == 'E' || type == 'G') body = unicode::upper(body);
  } else if (type == 0 && s.precision < 0) {
    body = float_repr(v);
  } else {
    int precision = s.precision < 0 ? 6 : s.precision;
    double x = v;
    std::string suffix;
    char conv = type;
    if (type == '%') {
      x = v * 100;
      conv = 'f';
      suffix = "%";
    } else if (type == 0) {
      conv = 'g';
      if (precision == 0) precision = 1;
    } else if (type == 'n') {
      conv = 'g';
    }
    if (conv != 'f' && conv != 'F' && conv != 'e' && conv != 'E' && conv != 'g' && conv != 'G') {
      throw Failure(std::string("Unknown format code '") + type + "' for object of type 'float'");
    }
    const std::string fmt = std::string("%") + (s.alternate ? "#" : "") + "." + std::to_string(precision) + conv;
    // Sized by a first call: %f of 1e308 at the largest precision is over
    // 4000 bytes, and a fixed buffer would cut it silently.
    const int size = std::snprintf(nullptr, 0, fmt.c_str(), x);
    if (size < 0) throw Failure("cannot format float");
    std::vector<char> buf(static_cast<size_t>(size) + 1);
    std::snprintf(buf.data(), buf.size(), fmt.c_str(), x);
    body.assign(buf.data(), static_cast<size_t>(size));
    body += suffix;
  }
  if (!body.empty() && body[0] != '-') {
    if (s.sign == '+') body.insert(0, "+");
    else if (s.sign == ' ') body.insert(0, " ");
  }
  if (s.grouping) {
    size_t start = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
    size_t end = start;
    while (end < body.size() && body[end] >= '0' && body[end] <= '9') ++end;
    body = body.substr(0, start) + group_thousands(body.substr(start, end - start), s.grouping) + body.substr(end);
  }
  if (s.zero && !s.align && s.width > 0) {
    Spec z = s;
    z.fill = '0';
    z.align = '=';
    return pad(body, z, '>');
  }
  return pad(body, s, '>');
}

Spec parse_spec(const std::string& spec) {
  Spec s;
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (spec.size() >= 2 && is_align(spec[1])) {
    s.fill = spec[0];
    s.align = spec[1];
    i = 2;
  } else if (!spec.empty() && is_align(spec[0])) {
    s.align = spec[0];
    i = 1;
  }
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) s.sign = spec[i++];
  if (i < spec.size() && spec[i] == '#') {
    s.alternate = true;
    ++i;
  }
  if (i < spec.size() && spec[i] == '0') {
    s.zero = true;
    ++i;
  }
  if (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') s.width = read_field(spec, i, "width");
  if (i < spec.size() && (spec[i] == ',' || spec[i] == '_')) s.grouping = spec[i++];
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    s.precision = 0;
    if (i >= spec.size() || spec[i] < '0' || spec[i] > '9') throw Failure("Format specifier missing precision");
    s.precision = read_field(spec, i, "precision");
  }
  if (i < spec.size()) s.type = spec[i++];
  if (i != spec.size()) throw Failure("Invalid format specifier '" + spec + "'");
  return s;
}

}  // namespace

std::string format_value(const Value& value, const std::string& spec) {
  if (spec.empty()) return str(value);
  const Spec s = parse_spec(spec);
  if (value.is_integral()) {
    if (s.type == 0 || s.type == 'd' || s.type == 'x' || s.type == 'X' || s.type == 'o' || s.type == 'b' ||
        s.type == 'c' || s.type == 'n') {
      if (value.is_bool() && s.type == 0) return pad(str(value), s, '<');
      return format_int(value.as_integral(), s);
    }
    return format_float(static_cast<double>(value.as_integral()), s);
  }
  if (value.is_float()) return format_float(value.as_float(), s);
  if (value.is_string()) {
    if (s.type != 0 && s.type != 's') {
      throw Failure(std::string("Unknown format code '") + s.type + "' for object of type 'str'");
    }
    std::string body = value.as_string();
    if (s.precision >= 0) {
      std::u32string cps = unicode::decode(body);
      if (cps.size() > static_cast<size_t>(s.precision)) cps.resize(static_cast<size_t>(s.precision));
      body = unicode::encode(cps);
    }
    return pad(body, s, '<');
  }
  throw Failure("unsupported format string passed to " + type_name(value) + ".__format__");
}

// ------------------------------------------------------------ str % args

std::string percent_format(const std::string& format, const Value& args) {
  std::vector<Value> positional;
  const Dict* mapping = nullptr;
  if (args.is_tuple()) {
    positional = args.as_list().items;
  } else {
    if (args.is_dict()) mapping = &args.as_dict();
    positional.push_back(args);
  }
  size_t next_arg = 0;
  bool used_mapping = false;
  auto take = [&]() -> const Value& {
    if (next_arg >= positional.size()) throw Failure("not enough arguments for format string");
    return positional[next_arg++];
  };
  std::string out;
  size_t i = 0;
  const size_t n = format.size();
  while (i < n) {
    const char c = format[i];
    if (c != '%') {
      out.push_back(c);
      ++i;
      continue;
    }
    ++i;
    if (i >= n) throw Failure("incomplete format");
    const Value* value = nullptr;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string::npos) throw Failure("incomplete format key");
      if (mapping == nullptr) throw Failure("format requires a mapping");
      const std::string key = format.substr(i + 1, close - i - 1);
      value = mapping->find(key);
      if (value == nullptr) throw Failure("KeyError: " + string_repr(key));
      used_mapping = true;
      i = close + 1;
    }
    Spec s;
    s.sign = 0;
    bool left = false;
    while (i < n && std::string_view("-+ #0").find(format[i]) != std::string_view::npos) {
      switch (format[i]) {
        case '-': left = true; break;
        case '+': s.sign = '+'; break;
        case ' ': if (s.sign != '+') s.sign = ' '; break;
        case '#': s.alternate = true; break;
        case '0': s.zero = true; break;
        default: break;
      }
      ++i;
    }
    if (i < n && format[i] == '*') {
      s.width = star_field(take(), "width");
      ++i;
    } else if (i < n && format[i] >= '0' && format[i] <= '9') {
      s.width = read_field(format, i, "width");
    }
    if (i < n && format[i] == '.') {
      ++i;
      s.precision = 0;
      if (i < n && format[i] == '*') {
        s.precision = star_field(take(), "precision");
        ++i;
      } else {
        s.precision = read_field(format, i, "precision");
      }
    }
    while (i < n && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
    if (i >= n) throw Failure("incomplete format");
    const char type = format[i++];
    if (type == '%') {
      out.push_back('%');
      continue;
    }
    if (value == nullptr) value = &take();
    if (left) s.align = '<';
    if (s.sign == 0) s.sign = '-';
    switch (type) {
      case 's':
      case 'r':
      case 'a': {
        std::string text = type == 's' ? str(*value) : repr(*value);
        if (s.precision >= 0) {
          std::u32string cps = unicode::decode(text);
          if (cps.size() > static_cast<size_t>(s.precision)) cps.resize(static_cast<size_t>(s.precision));
          text = unicode::encode(cps);
        }
        Spec p = s;
        p.zero = false;
        out += pad(text, p, '>');
        break;
      }
      case 'd':
      case 'i':
      case 'u': {
        if (!value->is_number()) {
          throw Failure(std::string("%") + type + " format: a real number is required, not " + type_name(*value));
        }
        const int64_t v = value->is_float() ? static_cast<int64_t>(std::trunc(value->as_float())) : value->as_integral();
        Spec p = s;
        p.type = 'd';
        p.precision = -1;
        out += format_int(v, p);
        break;
      }
      case 'x':
      case 'X':
      case 'o': {
        if (!value->is_integral()) {
          throw Failure(std::string("%") + type + " format: an integer is required, not " + type_name(*value));
        }
        Spec p = s;
        p.type = type;
        p.precision = -1;
        out += format_int(value->as_integral(), p);
        break;
      }
      case 'c': {
        std::string ch;
        if (value->is_integral()) unicode::append(ch, static_cast<char32_t>(value->as_integral()));
        else if (value->is_string() && unicode::length(value->as_string()) == 1) ch = value->as_string();
        else throw Failure("%c requires int or char");
        out += pad(ch, s, '>');
        break;
      }
      case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': {
        if (!value->is_number()) {
          throw Failure("must be real number, not " + type_name(*value));
        }
        Spec p = s;
        p.type = type;
        if (p.precision < 0) p.precision = 6;
        out += format_float(value->as_double(), p);
        break;
      }
      default:
        throw Failure(std::string("unsupported format character '") + type + "'");
    }
  }
  if (mapping == nullptr && next_arg < positional.size()) {
    throw Failure("not all arguments converted during string formatting");
  }
  (void)used_mapping;
  return out;
}

// ------------------------------------------------------------ str.format

std::string brace_format(const std::string& format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  size_t i = 0;
  const size_t n = format.size();
  while (i < n) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < n && format[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      throw Failure("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 < n && format[i + 1] == '{') {
      out.push_back('{');
      i += 2;
      continue;
    }
    // {field!conversion:spec}, where spec may hold nested {} fields.
    size_t j = i + 1;
    int depth = 1;
    while (j < n && depth > 0) {
      if (format[j] == '{') ++depth;
      else if (format[j] == '}') --depth;
      if (depth > 0) ++j;
    }
    if (j >= n) throw Failure("expected '}' before end of string");
    const std::string field = format.substr(i + 1, j - i - 1);
    i = j + 1;
    size_t name_end = 0;
    while (name_end < field.size() && field[name_end] != '!' && field[name_end] != ':') ++name_end;
    const std::string name = field.substr(0, name_end);
    char conversion = 0;
    std::string spec;
    size_t k = name_end;
    if (k < field.size() && field[k] == '!') {
      if (k + 1 >= field.size()) throw Failure("end of string while looking for conversion specifier");
      conversion = field[k + 1];
      k += 2;
    }
    if (k < field.size() && field[k] == ':') spec = field.substr(k + 1);
    else if (k < field.size()) throw Failure("expected ':' after conversion specifier");
    if (spec.find('{') != std::string::npos) spec = brace_format(spec, args);

    // The first part of the name picks the argument; .attr and [key] follow.
    size_t p = 0;
    while (p < name.size() && name[p] != '.' && name[p] != '[') ++p;
    const std::string head = name.substr(0, p);
    Value value;
    if (head.empty() || (head[0] >= '0' && head[0] <= '9')) {
      size_t index;
      if (head.empty()) {
        index = auto_index++;
      } else {
        index = 0;
        for (char d : head) {
          if (d < '0' || d > '9') throw Failure("invalid format field '" + head + "'");
          index = std::min<size_t>(index * 10 + static_cast<size_t>(d - '0'), SIZE_MAX / 20);
        }
      }
      if (index >= args.positional.size()) {
        throw Failure("Replacement index " + std::to_string(index) + " out of range for positional args tuple");
      }
      value = args.positional[index];
    } else {
      bool found = false;
      for (const auto& [key, v] : args.keyword) {
        if (key == head) {
          value = v;
          found = true;
        }
      }
      if (!found) throw Failure("KeyError: " + string_repr(head));
    }
    while (p < name.size()) {
      if (name[p] == '.') {
        size_t e = p + 1;
        while (e < name.size() && name[e] != '.' && name[e] != '[') ++e;
        value = get_attr(value, name.substr(p + 1, e - p - 1));
        p = e;
      } else {
        const size_t close = name.find(']', p);
        if (close == std::string::npos) throw Failure("Missing ']' in format string");
        const std::string key = name.substr(p + 1, close - p - 1);
        bool numeric = !key.empty() && key.size() < 19;
        for (char d : key) numeric = numeric && d >= '0' && d <= '9';
        value = numeric ? get_item(value, Value(static_cast<int64_t>(std::stoll(key)))) : get_item(value, Value(key));
        p = close + 1;
      }
    }
    if (conversion == 'r' || conversion == 'a') value = Value(repr(value));
    else if (conversion == 's') value = Value(str(value));
    else if (conversion != 0) throw Failure(std::string("Unknown conversion specifier ") + conversion);
    out += format_value(value, spec);
  }
  return out;
}

}  // namespace jinja
}  // namespace m40::chat
