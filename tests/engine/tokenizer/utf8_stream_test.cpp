#include "engine/tokenizer/utf8_stream.hpp"

#include <doctest/doctest.h>

namespace troupe {

TEST_CASE("a multi-byte character split over pushes is released whole") {
  utf8_stream s;
  const std::string euro = "\xe2\x82\xac";
  CHECK(s.push(std::string{'a', euro[0]}) == "a");
  CHECK(s.push(euro.substr(1, 1)) == "");
  CHECK(s.push(euro.substr(2) + "b") == euro + "b");
  CHECK(s.finish() == "");
}

TEST_CASE("every split point of a mixed string gives back the string") {
  const std::string text = "x\xc3\xa9y\xf0\x9f\x99\x82z\xe2\x82\xac";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    utf8_stream s;
    std::string out = s.push(text.substr(0, cut));
    // Nothing released may end inside a character.
    if (!out.empty()) CHECK((static_cast<unsigned char>(out.back()) & 0xc0) != 0xc0);
    out += s.push(text.substr(cut));
    out += s.finish();
    CHECK(out == text);
  }
}

TEST_CASE("invalid and unfinished sequences become U+FFFD") {
  const std::string fffd = "\xef\xbf\xbd";
  utf8_stream s;
  CHECK(s.push("\xff") == fffd);
  CHECK(s.push("\xc3(") == fffd + "(");           // lead byte without continuation
  CHECK(s.push("\xe0\x80\x80") == fffd + fffd + fffd);  // overlong form
  CHECK(s.push("\xed\xa0\x80") .find(fffd) == 0);  // surrogate
  utf8_stream t;
  CHECK(t.push("ok\xe2\x82") == "ok");
  CHECK(t.finish() == fffd);
}

}  // namespace troupe
