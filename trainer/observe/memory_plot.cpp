#include "trainer/observe/memory_plot.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <sstream>
#include <vector>

#include "model/scope.h"

namespace titan::trainer::observe {
namespace {

constexpr int kCats = model::kNumMemoryCategories;
// Stacking order (bottom first) and colors.
constexpr std::array<model::MemoryCategory, kCats> kOrder = {
    model::MemoryCategory::kParameters,    model::MemoryCategory::kOptimizerState,
    model::MemoryCategory::kGradients,     model::MemoryCategory::kActivations,
    model::MemoryCategory::kFloat8Casts,   model::MemoryCategory::kCommunication,
    model::MemoryCategory::kOther};
constexpr std::array<const char*, kCats> kColors = {"#4e79a7", "#f28e2b", "#e15759", "#59a14f",
                                                   "#b07aa1", "#edc948", "#9c9c9c"};

using Sample = std::array<int64_t, kCats>;  // bytes per category, in kOrder order

int order_index(uint8_t category) {
  for (int i = 0; i < kCats; ++i)
    if (static_cast<uint8_t>(kOrder[i]) == category) return i;
  return kCats - 1;  // other
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

std::string gib(int64_t bytes) {
  char buf[32];
  if (bytes >= (1ll << 30)) std::snprintf(buf, sizeof(buf), "%.3f GiB", bytes / double(1ll << 30));
  else std::snprintf(buf, sizeof(buf), "%.2f MiB", bytes / double(1ll << 20));
  return buf;
}

int64_t total(const Sample& s) {
  int64_t t = 0;
  for (auto v : s) t += v;
  return t;
}

}  // namespace

std::string memory_timeline_html(const MemoryRecord& record, const std::string& title) {
  // Replay the window: start from the live bytes per category at the restart.
  Sample cur{};
  for (int c = 0; c < 8; ++c) cur[order_index(static_cast<uint8_t>(c))] += record.category_bytes_at_restart[c];
  std::vector<Sample> samples{cur};
  size_t peak_at = 0;
  int ooms = 0;
  for (const MemoryEvent& e : record.events) {
    const int i = order_index(e.category);
    if (e.action == MemoryEvent::kAlloc) cur[i] += e.size;
    else if (e.action == MemoryEvent::kFree) cur[i] -= e.size;
    else ++ooms;
    samples.push_back(cur);
    if (total(cur) > total(samples[peak_at])) peak_at = samples.size() - 1;
  }
  // At most ~1500 columns: each keeps the sample with the largest total in its bucket, so the
  // peak is never averaged away.
  const size_t buckets = std::min<size_t>(samples.size(), 1500);
  std::vector<Sample> cols;
  for (size_t b = 0; b < buckets; ++b) {
    const size_t lo = b * samples.size() / buckets, hi = (b + 1) * samples.size() / buckets;
    size_t best = lo;
    for (size_t j = lo; j < hi; ++j)
      if (total(samples[j]) > total(samples[best])) best = j;
    cols.push_back(samples[best]);
  }
  int64_t ymax = 1;
  for (const auto& c : cols) ymax = std::max(ymax, total(c));

  const double W = 1000, H = 420, left = 70, top = 20;
  auto x_of = [&](size_t i) { return left + W * (cols.size() <= 1 ? 0.0 : double(i) / (cols.size() - 1)); };
  auto y_of = [&](int64_t v) { return top + H - H * double(v) / double(ymax); };

  std::ostringstream svg;
  svg.precision(1);
  svg << std::fixed;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << left + W + 20 << "' height='"
      << top + H + 50 << "' font-family='sans-serif' font-size='12'>\n";
  // Stacked areas: category k spans [sum of k-1 below, sum of k].
  for (int k = 0; k < kCats; ++k) {
    std::ostringstream upper, lower;
    for (size_t i = 0; i < cols.size(); ++i) {
      int64_t below = 0;
      for (int j = 0; j < k; ++j) below += cols[i][j];
      upper << x_of(i) << "," << y_of(below + cols[i][k]) << " ";
    }
    for (size_t i = cols.size(); i-- > 0;) {
      int64_t below = 0;
      for (int j = 0; j < k; ++j) below += cols[i][j];
      lower << x_of(i) << "," << y_of(below) << " ";
    }
    svg << "<polygon fill='" << kColors[k] << "' stroke='none' points='" << upper.str()
        << lower.str() << "'><title>" << model::memory_category_name(kOrder[k])
        << "</title></polygon>\n";
  }
  // Axes and y ticks.
  svg << "<line x1='" << left << "' y1='" << top + H << "' x2='" << left + W << "' y2='" << top + H
      << "' stroke='black'/>\n<line x1='" << left << "' y1='" << top << "' x2='" << left
      << "' y2='" << top + H << "' stroke='black'/>\n";
  for (int t = 0; t <= 4; ++t) {
    const int64_t v = ymax * t / 4;
    svg << "<text x='" << left - 6 << "' y='" << y_of(v) + 4 << "' text-anchor='end'>" << gib(v)
        << "</text><line x1='" << left << "' y1='" << y_of(v) << "' x2='" << left + W << "' y2='"
        << y_of(v) << "' stroke='#ddd'/>\n";
  }
  svg << "<text x='" << left + W / 2 << "' y='" << top + H + 35
      << "' text-anchor='middle'>allocator events (allocations and frees, in order) over the "
         "recorded window</text>\n</svg>\n";

  const Sample& peak = samples[peak_at];
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>titan memory: "
       << escape(title) << "</title>\n<style>body{font-family:sans-serif;margin:20px}"
       << "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;"
       << "text-align:right}.sw{display:inline-block;width:12px;height:12px;margin-right:6px}"
       << "</style></head><body>\n<h2>titan memory: " << escape(title) << "</h2>\n<p>Live "
       << "tensor bytes (CPU: the tracked allocator; CUDA: the caching allocator's blocks), stacked by what they are for (from the "
       << "scope that allocated them). Peak in this window: <b>" << gib(total(peak))
       << "</b> at event " << peak_at << " of " << record.events.size()
       << (record.events_truncated ? " (recording truncated)" : "")
       << (ooms ? ", <b>out-of-memory error recorded</b>" : "") << ".</p>\n"
       << svg.str() << "<table><tr><th style='text-align:left'>category</th><th>at start</th>"
       << "<th>at peak</th><th>at end</th></tr>\n";
  for (int k = 0; k < kCats; ++k)
    html << "<tr><td style='text-align:left'><span class='sw' style='background:" << kColors[k]
         << "'></span>" << model::memory_category_name(kOrder[k]) << "</td><td>"
         << gib(samples.front()[k]) << "</td><td>" << gib(peak[k]) << "</td><td>"
         << gib(samples.back()[k]) << "</td></tr>\n";
  html << "<tr><th style='text-align:left'>total</th><th>" << gib(total(samples.front()))
       << "</th><th>" << gib(total(peak)) << "</th><th>" << gib(total(samples.back()))
       << "</th></tr></table>\n<p>The snapshot beside this file (.pickle) has every allocation "
       << "with its scope frames; PyTorch's viewer reads it: <code>python -m "
       << "torch.cuda._memory_viz trace_plot FILE.pickle -o trace.html</code>.</p>\n</body></html>\n";
  return html.str();
}

}  // namespace titan::trainer::observe
