// tests/torchao_reference.h — reference tensors made by a script under scripts/reference/ with
// the venv's torch and the torchao sources scripts/setup.sh installs (.deps/torchao), read back
// by the tests that compare titan with torchao (test_block_scaled.cpp, test_grouped_experts.cpp).
// Without torchao the cases report themselves skipped (exit 77), never passed.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace titan_test {

// The reference file's layout is safetensors (8-byte header length, JSON header, raw bytes),
// with F32, BF16 and U8 tensors; titan's checkpoint reader loads only floating dtypes, so the
// tests read their own file here.
inline std::map<std::string, at::Tensor> load_reference(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, ' ');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  const nlohmann::json h = nlohmann::json::parse(header);
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, e] : h.items()) {
    const std::string dtype = e["dtype"];
    const at::ScalarType t = dtype == "F32" ? at::kFloat : dtype == "BF16" ? at::kBFloat16 : at::kByte;
    const std::vector<int64_t> shape = e["shape"].get<std::vector<int64_t>>();
    at::Tensor v = at::empty(shape, at::TensorOptions().dtype(t));
    const int64_t begin = e["data_offsets"][0], end = e["data_offsets"][1];
    REQUIRE(end - begin == static_cast<int64_t>(v.nbytes()));
    in.seekg(static_cast<std::streamoff>(8 + header_len + begin));
    in.read(static_cast<char*>(v.data_ptr()), end - begin);
    out[name] = v;
  }
  return out;
}

// The tensors `script` (a file of scripts/reference/) writes, produced once per test process;
// nullptr when torchao is not installed or the script fails.
inline const std::map<std::string, at::Tensor>* torchao_reference(const std::string& script_name) {
  namespace fs = std::filesystem;
  static std::map<std::string, std::map<std::string, at::Tensor>> loaded;
  static std::map<std::string, bool> ok;
  if (!ok.count(script_name)) {
    ok[script_name] = false;
    const char* src = std::getenv("TITAN_SOURCE_DIR");
    if (src && fs::exists(fs::path(src) / ".deps/torchao/torchao")) {
      // Each test case is its own process under ctest: the file is made once per version of the
      // script (named by its modification time) and shared by every process, in .deps/ (each
      // test process's temp folder is its own and removed: Note [One scratch folder per test
      // process]; one torchao run is ~9 s, which every case paid when the file lived there);
      // written to a temporary name and renamed, so concurrent cases never read half a file.
      const fs::path script = fs::path(src) / "scripts/reference" / script_name;
      const auto stamp = fs::last_write_time(script).time_since_epoch().count();
      const fs::path cache = fs::path(src) / ".deps" / "reference_cache";
      fs::create_directories(cache);
      const fs::path out =
          cache / ("titan_" + fs::path(script_name).stem().string() + "_" + std::to_string(stamp) + ".safetensors");
      // One process makes it while the others wait on the lock (then find it made).
      const int lock = ::open((out.string() + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
      if (lock >= 0) ::flock(lock, LOCK_EX);
      if (!fs::exists(out)) {
        const fs::path tmp = out.string() + "." + std::to_string(::getpid());
        const std::string cmd = "PYTHONPATH=" + std::string(src) + "/.deps/torchao " + std::string(src) +
                                "/.deps/venv/bin/python " + script.string() + " " + tmp.string() + " > /dev/null 2>&1";
        if (std::system(cmd.c_str()) == 0 && fs::exists(tmp)) fs::rename(tmp, out);
      }
      if (lock >= 0) ::close(lock);  // releases the lock
      ok[script_name] = fs::exists(out);
      if (ok[script_name]) loaded[script_name] = load_reference(out.string());
    }
  }
  return ok[script_name] ? &loaded[script_name] : nullptr;
}

inline const at::Tensor& reference_tensor(const std::map<std::string, at::Tensor>& tensors, const std::string& name) {
  const auto it = tensors.find(name);
  if (it == tensors.end()) FAIL("reference tensor " << name << " missing");
  return it->second;
}

// Bitwise equality, NaN payloads included (float8 data and E8M0 scales compare as bytes).
inline bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.element_size() != b.element_size()) return false;
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

inline at::Tensor bytes(const at::Tensor& t) { return t.contiguous().view(at::kByte); }

// SQNR(ref, actual) = 20 log10(||ref|| / ||ref - actual||) in dB, in float64.
inline double sqnr(const at::Tensor& ref, const at::Tensor& actual) {
  at::Tensor r = ref.detach().to(at::kDouble), a = actual.detach().to(at::kDouble);
  const double signal = r.norm().item<double>(), noise = (r - a).norm().item<double>();
  return noise == 0.0 ? std::numeric_limits<double>::infinity() : 20.0 * std::log10(signal / noise);
}

// torchao's references run with one thread; a GEMM's summation order may depend on the thread
// count, so the comparisons run with one too.
struct OneThread {
  int saved = at::get_num_threads();
  OneThread() { at::set_num_threads(1); }
  ~OneThread() { at::set_num_threads(saved); }
};

}  // namespace titan_test

// Catch2 v2 has no SKIP: a case without its reference ends the process with the code ctest
// reports as "Skipped" (SKIP_RETURN_CODE 77, tests/catch_to_ctest.cmake), never as passed.
#define REQUIRE_TORCHAO_REFERENCE(tensors)                                                            \
  if (!(tensors)) {                                                                                   \
    std::cout << "SKIPPED: the torchao reference is unavailable (.deps/torchao: run scripts/setup.sh)\n"; \
    std::exit(77);                                                                                    \
  }
