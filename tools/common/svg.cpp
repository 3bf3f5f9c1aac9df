#include "tools/common/svg.hpp"

#include <fmt/format.h>

namespace stowage::tools {

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters other than tab/newline are not allowed in XML 1.0.
        if (c < 0x20 && c != '\t' && c != '\n') out += '?';
        else out += static_cast<char>(c);
    }
  }
  return out;
}

SvgWriter::SvgWriter(double width, double height) {
  out_ = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} {1:.0f}\" "
      "font-family=\"sans-serif\">\n<rect x=\"0\" y=\"0\" width=\"{0:.0f}\" height=\"{1:.0f}\" fill=\"white\"/>\n",
      width, height);
}

void SvgWriter::rect(double x, double y, double w, double h, std::string_view fill, std::string_view title) {
  out_ += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"", x, y, w, h,
                      xml_escape(fill));
  if (title.empty()) out_ += "/>\n";
  else out_ += fmt::format("><title>{}</title></rect>\n", xml_escape(title));
}

void SvgWriter::line(double x1, double y1, double x2, double y2, std::string_view stroke, double width) {
  out_ += fmt::format(
      "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"{:.1f}\"/>\n", x1, y1,
      x2, y2, xml_escape(stroke), width);
}

void SvgWriter::polyline(std::string_view points, std::string_view stroke, double width) {
  out_ += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{:.1f}\"/>\n",
                      xml_escape(points), xml_escape(stroke), width);
}

void SvgWriter::text(double x, double y, std::string_view content, double size, std::string_view anchor) {
  out_ += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"{:.0f}\" text-anchor=\"{}\">{}</text>\n", x, y, size,
                      xml_escape(anchor), xml_escape(content));
}

std::string SvgWriter::finish() { return out_ + "</svg>\n"; }

}  // namespace stowage::tools
