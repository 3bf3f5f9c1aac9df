#pragma once
// A minimal SVG writer: the elements the charts use, with text and attributes escaped so any
// model or tag name yields well-formed XML.
#include <string>
#include <string_view>

namespace stowage::tools {

std::string xml_escape(std::string_view text);

class SvgWriter {
 public:
  SvgWriter(double width, double height);
  void rect(double x, double y, double w, double h, std::string_view fill, std::string_view title = {});
  void line(double x1, double y1, double x2, double y2, std::string_view stroke, double width = 1.0);
  void polyline(std::string_view points, std::string_view stroke, double width = 1.5);
  void text(double x, double y, std::string_view content, double size = 12, std::string_view anchor = "start");
  std::string finish();  // closes the document

 private:
  std::string out_;
};

}  // namespace stowage::tools
