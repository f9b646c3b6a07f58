// gpu_bench: two kernels sharing one GPU, in the style of Nova's Table IV /
// Fig. 4 — a memory-bound job (a streaming triad, a[i] = b[i] + s·c[i], over
// three 256 MiB arrays, several launches) and a compute-bound job (FMA chains
// in registers, calibrated to take about as long as the memory job alone),
// run three ways:
//
//   (a) partitions  co-running on disjoint green contexts of ONE split: the
//                   memory job gets 16/32/48/64 SMs, the compute job the rest
//                   (a GreenContextPool with stages {"compute", "memory"})
//   (b) streams     co-running on two plain streams over the whole GPU
//   (c) sequential  one after the other on one plain stream
//
// Each job's latency is the median over --runs runs of CUDA events around
// it; the makespan is from the first job's start to the last one's end. The
// gain is (c)'s makespan over the mode's: how much more work per second the
// GPU finishes by co-running. The memory job's arrays are allocated once;
// nothing is checked but that every call succeeded.
//
// --sim prints the same table predicted by the simulated device's roofline
// (gpu/sim_device.h kernel_ns, with FP32 FMA throughput for the compute
// job): a MODEL, not a measurement. The model does not describe kernels
// sharing SMs, so (b) has no prediction there.
//
// Without a GPU (no driver, no device, or no nvcc-built kernels) it says why
// and exits 77, which ctest counts as skipped. `--json` prints the rows as
// JSON. `--quick` is the smoke run (2 runs, smaller jobs).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/parse.h"
#include "gpu/cuda_device.h"
#include "gpu/green_pool.h"
#include "gpu/partition.h"
#include "gpu/sim_device.h"
#include "gpu/testing/cuda_harness.h"

namespace tandem::bench {
namespace {

using gpu::DevicePtr;
using gpu::StreamId;
using nlohmann::json;

constexpr int kSkipped = 77;  // ctest's SKIP_RETURN_CODE
// H100 SXM FP32 (CUDA cores, not tensor cores): 67 TFLOP/s (NVIDIA H100
// datasheet). The sim's default roofline is dense BF16 tensor throughput,
// which an FMA loop in registers does not reach.
constexpr double kFp32FlopsPerS = 67e12;

struct Options {
  bool sim = false;
  bool json = false;
  bool quick = false;
  int runs = 10;
  int ordinal = 0;
  std::vector<std::uint32_t> mem_sms = {16, 32, 48, 64};
  std::uint64_t triad_elems = 64ull << 20;  // floats per array (256 MiB)
  std::uint32_t triad_launches = 8;
};

// The two jobs, as launched and as the roofline sees them.
struct Jobs {
  std::uint64_t triad_elems = 0;
  std::uint32_t triad_launches = 0;
  std::uint32_t fma_blocks = 0;
  std::uint32_t fma_threads = 256;
  std::uint64_t fma_iters = 0;
  gpu::KernelWork triad() const {
    const double n = static_cast<double>(triad_elems);
    return {.flops = 2 * n, .bytes = 12 * n};
  }
  gpu::KernelWork fma() const {
    return {.flops = 16.0 * static_cast<double>(fma_iters) * fma_blocks * fma_threads, .bytes = 0};
  }
};

struct Times {
  double mem_ms = 0;
  double comp_ms = 0;
  double makespan_ms = 0;
};

struct Row {
  std::string mode;
  std::uint32_t mem_sms = 0;
  std::uint32_t comp_sms = 0;
  std::optional<Times> times;  // absent: not modelled
  double gain = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::ranges::sort(v);
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

Times median_times(const std::vector<Times>& runs) {
  std::vector<double> m;
  std::vector<double> c;
  std::vector<double> s;
  for (const Times& t : runs) {
    m.push_back(t.mem_ms);
    c.push_back(t.comp_ms);
    s.push_back(t.makespan_ms);
  }
  return {.mem_ms = median(m), .comp_ms = median(c), .makespan_ms = median(s)};
}

// Runs the jobs on DeviceApi streams: the real GPU (events, kernels through
// the harness) or the simulated one (virtual time).
class Runner {
 public:
  virtual ~Runner() = default;
  // Both jobs at once, the memory job on `mem`, the compute job on `comp`;
  // with mem == comp, one after the other.
  virtual base::Result<Times> run(StreamId mem, StreamId comp) = 0;
};

class CudaRunner final : public Runner {
 public:
  static base::Result<std::unique_ptr<CudaRunner>> create(gpu::DeviceApi& device, gpu::testing::CudaHarness& h,
                                                          Jobs& jobs, StreamId plain) {
    std::unique_ptr<CudaRunner> r(new CudaRunner(device, h));
    const std::uint64_t bytes = jobs.triad_elems * sizeof(float);
    for (DevicePtr* p : {&r->a_, &r->b_, &r->c_}) {
      auto got = h.alloc(bytes);
      if (!got) return std::unexpected(got.error());
      *p = *got;
    }
    if (auto z = h.memset_d32(r->b_, 0x3f800000u, jobs.triad_elems); !z) return std::unexpected(z.error());  // 1.0f
    if (auto z = h.memset_d32(r->c_, 0x40000000u, jobs.triad_elems); !z) return std::unexpected(z.error());  // 2.0f
    auto sink = h.alloc(sizeof(float) * 65536);
    if (!sink) return std::unexpected(sink.error());
    r->sink_ = *sink;
    for (void** e : {&r->ev_[0], &r->ev_[1], &r->ev_[2], &r->ev_[3]}) {
      auto got = h.create_timing_event();
      if (!got) return std::unexpected(got.error());
      *e = *got;
    }
    r->jobs_ = &jobs;
    // Calibrate the compute job to the memory job's time, both alone on
    // the whole GPU.
    jobs.fma_iters = 4096;
    auto mem = r->run(plain, plain);
    if (!mem) return std::unexpected(mem.error());
    for (int i = 0; i < 4; ++i) {
      auto t = r->run(plain, plain);
      if (!t) return std::unexpected(t.error());
      if (t->comp_ms <= 0) break;
      jobs.fma_iters = std::max<std::uint64_t>(
          1, static_cast<std::uint64_t>(static_cast<double>(jobs.fma_iters) * t->mem_ms / t->comp_ms));
    }
    return r;
  }

  ~CudaRunner() override {
    (void)h_.synchronize();
    for (DevicePtr p : {a_, b_, c_, sink_}) {
      if (p != 0) (void)h_.free(p);
    }
    for (void* e : ev_) {
      if (e != nullptr) (void)h_.destroy_event(e);
    }
  }

  base::Result<Times> run(StreamId mem, StreamId comp) override {
    auto ms = device_.native_stream(mem);
    if (!ms) return std::unexpected(ms.error());
    auto cs = device_.native_stream(comp);
    if (!cs) return std::unexpected(cs.error());
    if (auto r = h_.record(ev_[0], *ms); !r) return std::unexpected(r.error());
    float s = 3.0f;
    unsigned long long n = jobs_->triad_elems;
    for (std::uint32_t i = 0; i < jobs_->triad_launches; ++i) {
      void* args[] = {&a_, &b_, &c_, &s, &n};
      if (auto r = h_.launch("tandem_triad", {triad_grid()}, {256}, *ms, args); !r) return std::unexpected(r.error());
    }
    if (auto r = h_.record(ev_[1], *ms); !r) return std::unexpected(r.error());
    if (auto r = h_.record(ev_[2], *cs); !r) return std::unexpected(r.error());
    unsigned long long iters = jobs_->fma_iters;
    void* args[] = {&sink_, &iters};
    if (auto r = h_.launch("tandem_fma", {jobs_->fma_blocks}, {jobs_->fma_threads}, *cs, args); !r) {
      return std::unexpected(r.error());
    }
    if (auto r = h_.record(ev_[3], *cs); !r) return std::unexpected(r.error());
    Times t;
    // The memory job is enqueued first, so its start event is the first.
    auto m = h_.elapsed_ms(ev_[0], ev_[1]);
    if (!m) return std::unexpected(m.error());
    auto c = h_.elapsed_ms(ev_[2], ev_[3]);
    if (!c) return std::unexpected(c.error());
    auto to_comp_end = h_.elapsed_ms(ev_[0], ev_[3]);
    if (!to_comp_end) return std::unexpected(to_comp_end.error());
    t.mem_ms = *m;
    t.comp_ms = *c;
    t.makespan_ms = std::max(*m, *to_comp_end);
    return t;
  }

 private:
  CudaRunner(gpu::DeviceApi& device, gpu::testing::CudaHarness& h) : device_(device), h_(h) {}
  // Enough blocks to fill the GPU several times over; grid-stride beyond.
  std::uint32_t triad_grid() const { return h_.sm_count() * 8; }

  gpu::DeviceApi& device_;
  gpu::testing::CudaHarness& h_;
  const Jobs* jobs_ = nullptr;
  DevicePtr a_ = 0;
  DevicePtr b_ = 0;
  DevicePtr c_ = 0;
  DevicePtr sink_ = 0;
  void* ev_[4] = {nullptr, nullptr, nullptr, nullptr};
};

// The roofline on the simulated device's virtual clock: each job's time is
// kernel_ns at its stream's SM count; jobs on different streams overlap.
class SimRunner final : public Runner {
 public:
  SimRunner(gpu::SimDevice& device, const Jobs& jobs) : device_(device), jobs_(jobs) {}

  base::Result<Times> run(StreamId mem, StreamId comp) override {
    const std::uint64_t t0 = device_.now_ns();
    for (std::uint32_t i = 0; i < jobs_.triad_launches; ++i) {
      if (auto r = device_.launch_kernel(mem, jobs_.triad()); !r) return std::unexpected(r.error());
    }
    auto mem_end = device_.stream_tail_ns(mem);
    if (!mem_end) return std::unexpected(mem_end.error());
    const std::uint64_t comp_start = std::max(t0, mem == comp ? *mem_end : t0);
    if (auto r = device_.launch_kernel(comp, jobs_.fma()); !r) return std::unexpected(r.error());
    auto comp_end = device_.stream_tail_ns(comp);
    if (!comp_end) return std::unexpected(comp_end.error());
    if (auto r = device_.stream_synchronize(mem); !r) return std::unexpected(r.error());
    if (auto r = device_.stream_synchronize(comp); !r) return std::unexpected(r.error());
    return Times{.mem_ms = static_cast<double>(*mem_end - t0) / 1e6,
                 .comp_ms = static_cast<double>(*comp_end - comp_start) / 1e6,
                 .makespan_ms = static_cast<double>(std::max(*mem_end, *comp_end) - t0) / 1e6};
  }

 private:
  gpu::SimDevice& device_;
  const Jobs& jobs_;
};

void print_usage(std::FILE* to) {
  fmt::print(to,
             "usage: gpu_bench [--sim] [--json] [--quick] [--runs N] [--device N] [--mem-sms LIST]\n"
             "                 [--triad-mib N] [--triad-launches N] [--help]\n"
             "\n"
             "A memory-bound job (triad) and a compute-bound job (FMA) co-running on disjoint green-context\n"
             "partitions of one split, on two plain streams, and sequentially: each job's median latency\n"
             "and the throughput gain over sequential. Exits 77 (skipped) without a usable GPU.\n"
             "\n"
             "  --sim             the simulated device's roofline model instead of a GPU (a model, not a measurement)\n"
             "  --json            print the table as JSON\n"
             "  --quick           smoke run: 2 runs, a 32 MiB triad\n"
             "  --runs N          runs per mode (default 10; medians)\n"
             "  --device N        CUDA ordinal (default 0)\n"
             "  --mem-sms LIST    the memory job's SM counts, comma-separated (default 16,32,48,64)\n"
             "  --triad-mib N     MiB per triad array (default 256; three arrays)\n"
             "  --triad-launches N  triad launches in the memory job (default 8)\n"
             "  --help            show this text\n");
}

// 0: run; 1: --help printed; 2: usage error (printed).
int parse_args(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto number = [&](std::uint64_t& out) {
      if (i + 1 >= argc) {
        fmt::print(stderr, "gpu_bench: {} needs a value\n", arg);
        return false;
      }
      auto v = base::parse_int<std::uint64_t>(argv[++i]);
      if (!v || *v == 0 || *v > (1u << 20)) {
        fmt::print(stderr, "gpu_bench: {}: '{}' is not an integer in [1, 1048576]\n", arg, argv[i]);
        return false;
      }
      out = *v;
      return true;
    };
    std::uint64_t v = 0;
    if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      return 1;
    } else if (arg == "--sim") {
      o.sim = true;
    } else if (arg == "--json") {
      o.json = true;
    } else if (arg == "--quick") {
      o.quick = true;
      o.runs = 2;
      o.triad_elems = 8ull << 20;
      o.triad_launches = 4;
    } else if (arg == "--runs") {
      if (!number(v)) return 2;
      o.runs = static_cast<int>(std::min<std::uint64_t>(v, 1000));
    } else if (arg == "--device") {
      if (i + 1 >= argc) {
        fmt::print(stderr, "gpu_bench: --device needs a value\n");
        return 2;
      }
      auto d = base::parse_int<int>(argv[++i]);
      if (!d || *d < 0) {
        fmt::print(stderr, "gpu_bench: --device: '{}' is not a CUDA ordinal\n", argv[i]);
        return 2;
      }
      o.ordinal = *d;
    } else if (arg == "--mem-sms") {
      if (i + 1 >= argc) {
        fmt::print(stderr, "gpu_bench: --mem-sms needs a list\n");
        return 2;
      }
      o.mem_sms.clear();
      for (std::string_view part : base::split(argv[++i], ',', true)) {
        auto n = base::parse_int<std::uint32_t>(part);
        if (!n || *n == 0) {
          fmt::print(stderr, "gpu_bench: --mem-sms: '{}' is not a positive SM count\n", part);
          return 2;
        }
        o.mem_sms.push_back(*n);
      }
      if (o.mem_sms.empty()) {
        fmt::print(stderr, "gpu_bench: --mem-sms: empty list\n");
        return 2;
      }
    } else if (arg == "--triad-mib") {
      if (!number(v)) return 2;
      o.triad_elems = (v << 20) / sizeof(float);
    } else if (arg == "--triad-launches") {
      if (!number(v)) return 2;
      o.triad_launches = static_cast<std::uint32_t>(std::min<std::uint64_t>(v, 1000));
    } else {
      fmt::print(stderr, "gpu_bench: unknown argument '{}'\n", arg);
      print_usage(stderr);
      return 2;
    }
  }
  return 0;
}

// The pool: stages {"compute", "memory"}; one partition per feasible memory
// SM count, compute getting the rest. "memory" is the last stage, so it
// orders the partitions (green_pool.h).
base::Result<gpu::PoolConfig> pool_config(const gpu::SmResource& res, const std::vector<std::uint32_t>& mem_sms) {
  gpu::PoolConfig config;
  config.stages = {{.name = "compute", .priority = 0}, {.name = "memory", .priority = 0}};
  std::vector<std::uint32_t> sorted = mem_sms;
  std::ranges::sort(sorted);
  auto dup = std::ranges::unique(sorted);
  sorted.erase(dup.begin(), dup.end());
  const std::vector<std::uint32_t> feasible = gpu::feasible_sm_counts(res);
  for (std::uint32_t m : sorted) {
    if (!std::ranges::binary_search(feasible, m) || m + gpu::block_size(res) > res.sm_count) {
      return base::make_error(EINVAL, fmt::format("--mem-sms: {} SMs is not a feasible partition of a {}-SM device "
                                                  "that leaves SMs for the compute job",
                                                  m, res.sm_count));
    }
    config.partitions.push_back({.sizes = {std::uint32_t{0}, m}});
  }
  return config;
}

struct Table {
  std::string device;
  bool model = false;
  int runs = 0;
  Jobs jobs;
  std::vector<Row> rows;
};

base::Result<Table> measure(gpu::DeviceApi& device, Runner* runner, const Options& o, Jobs& jobs,
                            const std::function<base::Result<std::unique_ptr<Runner>>(StreamId)>& make_runner) {
  Table t;
  auto info = device.info();
  if (!info) return std::unexpected(info.error());
  auto res = device.sm_resource();
  if (!res) return std::unexpected(res.error());
  t.device = info->name;
  t.runs = o.runs;

  auto seq_stream = device.create_plain_stream(0);
  if (!seq_stream) return std::unexpected(seq_stream.error());
  auto plain2 = device.create_plain_stream(0);
  if (!plain2) return std::unexpected(plain2.error());
  std::unique_ptr<Runner> owned;
  if (runner == nullptr) {
    auto made = make_runner(*seq_stream);
    if (!made) return std::unexpected(made.error());
    owned = std::move(*made);
    runner = owned.get();
  }
  t.jobs = jobs;

  auto config = pool_config(*res, o.mem_sms);
  if (!config) return std::unexpected(config.error());
  auto pool = gpu::GreenContextPool::create(device, *config);
  if (!pool) return std::unexpected(pool.error());

  auto repeat = [&](StreamId mem, StreamId comp) -> base::Result<Times> {
    if (auto warm = runner->run(mem, comp); !warm) return std::unexpected(warm.error());
    std::vector<Times> all;
    for (int i = 0; i < o.runs; ++i) {
      auto r = runner->run(mem, comp);
      if (!r) return std::unexpected(r.error());
      all.push_back(*r);
    }
    return median_times(all);
  };

  auto seq = repeat(*seq_stream, *seq_stream);
  if (!seq) return std::unexpected(seq.error());
  const double seq_ms = seq->makespan_ms;
  t.rows.push_back(
      {.mode = "sequential", .mem_sms = res->sm_count, .comp_sms = res->sm_count, .times = *seq, .gain = 1.0});
  if (device.backend() == "sim") {
    t.rows.push_back(
        {.mode = "streams", .mem_sms = res->sm_count, .comp_sms = res->sm_count, .times = std::nullopt, .gain = 0});
  } else {
    auto streams = repeat(*seq_stream, *plain2);
    if (!streams) return std::unexpected(streams.error());
    t.rows.push_back({.mode = "streams",
                      .mem_sms = res->sm_count,
                      .comp_sms = res->sm_count,
                      .times = *streams,
                      .gain = seq_ms / streams->makespan_ms});
  }
  gpu::GreenContextPool& p = **pool;
  auto comp_stage = p.stage("compute");
  auto mem_stage = p.stage("memory");
  if (!comp_stage || !mem_stage) return base::make_error(EIO, "gpu_bench: pool lost its stages");
  for (std::size_t i = 0; i < p.partition_count(); ++i) {
    auto r = repeat(p.stream(i, *mem_stage), p.stream(i, *comp_stage));
    if (!r) return std::unexpected(r.error());
    t.rows.push_back({.mode = "partitions",
                      .mem_sms = p.sm_count(i, *mem_stage),
                      .comp_sms = p.sm_count(i, *comp_stage),
                      .times = *r,
                      .gain = seq_ms / r->makespan_ms});
  }
  owned.reset();
  pool->reset();
  (void)device.destroy_stream(*plain2);
  (void)device.destroy_stream(*seq_stream);
  return t;
}

void print_table(const Table& t, const Options& o) {
  const Jobs& j = t.jobs;
  if (o.json) {
    json rows = json::array();
    for (const Row& r : t.rows) {
      json row = {{"mode", r.mode}, {"memory_sms", r.mem_sms}, {"compute_sms", r.comp_sms}};
      if (r.times) {
        row["memory_ms"] = r.times->mem_ms;
        row["compute_ms"] = r.times->comp_ms;
        row["makespan_ms"] = r.times->makespan_ms;
        row["gain"] = r.gain;
      } else {
        row["modelled"] = false;
      }
      rows.push_back(row);
    }
    json out = {
        {"device", t.device},
        {"model", t.model},
        {"runs", t.runs},
        {"memory_job", {{"kernel", "triad"}, {"elements", j.triad_elems}, {"launches", j.triad_launches}}},
        {"compute_job",
         {{"kernel", "fma"}, {"blocks", j.fma_blocks}, {"threads", j.fma_threads}, {"iterations", j.fma_iters}}},
        {"rows", rows}};
    fmt::print("{}\n", out.dump(2));
    return;
  }
  if (t.model) {
    fmt::print(
        "MODEL, not a measurement: the simulated device's roofline (gpu/sim_device.h kernel_ns),\n"
        "FP32 FMA at {:.0f} TFLOP/s; kernels sharing SMs are not modelled.\n",
        kFp32FlopsPerS / 1e12);
  }
  fmt::print(
      "{}: memory job {} × triad over 3 × {} MiB; compute job FMA {} blocks × {} threads × {} rounds; "
      "medians of {} runs\n\n",
      t.device, j.triad_launches, (j.triad_elems * sizeof(float)) >> 20, j.fma_blocks, j.fma_threads, j.fma_iters,
      t.runs);
  fmt::print("{:<16} {:>8} {:>9} {:>10} {:>11} {:>12} {:>6}\n", "mode", "mem SMs", "comp SMs", "memory ms",
             "compute ms", "makespan ms", "gain");
  for (const Row& r : t.rows) {
    if (r.times) {
      fmt::print("{:<16} {:>8} {:>9} {:>10.3f} {:>11.3f} {:>12.3f} {:>5.2f}x\n", r.mode, r.mem_sms, r.comp_sms,
                 r.times->mem_ms, r.times->comp_ms, r.times->makespan_ms, r.gain);
    } else {
      fmt::print("{:<16} {:>8} {:>9} {:>10} {:>11} {:>12} {:>6}\n", r.mode, r.mem_sms, r.comp_sms, "-", "-", "-",
                 "n/a");
    }
  }
  fmt::print("\ngain: sequential makespan / this mode's (more than 1: co-running finishes the pair sooner)\n");
}

int run_sim(const Options& o) {
  gpu::SimDeviceConfig config;
  config.flops_per_sm_per_s = kFp32FlopsPerS / config.sm_count;
  auto dev = gpu::SimDevice::create(config);
  if (!dev) {
    fmt::print(stderr, "gpu_bench: {}\n", dev.error().message());
    return 1;
  }
  gpu::SimDevice& d = **dev;
  Jobs jobs{.triad_elems = o.triad_elems, .triad_launches = o.triad_launches, .fma_blocks = d.config().sm_count * 8};
  // The compute job takes as long alone as the memory job alone.
  const double mem_ns = static_cast<double>(d.kernel_ns(jobs.triad(), d.config().sm_count)) * jobs.triad_launches;
  const double flops = mem_ns / 1e9 * d.config().flops_per_sm_per_s * d.config().sm_count;
  jobs.fma_iters =
      std::max<std::uint64_t>(1, static_cast<std::uint64_t>(flops / (16.0 * jobs.fma_blocks * jobs.fma_threads)));
  SimRunner runner(d, jobs);
  auto table = measure(d, &runner, o, jobs, nullptr);
  if (!table) {
    fmt::print(stderr, "gpu_bench: {}\n", table.error().message());
    return 1;
  }
  table->model = true;
  print_table(*table, o);
  return 0;
}

int run_cuda(const Options& o) {
  auto dev = gpu::open_cuda_device(o.ordinal);
  if (!dev) {
    fmt::print(stderr, "gpu_bench: skipped: no usable CUDA device: {}\n", dev.error().message());
    return kSkipped;
  }
  auto h = gpu::testing::CudaHarness::open(o.ordinal);
  if (!h) {
    fmt::print(stderr, "gpu_bench: skipped: {}\n", h.error().message());
    return kSkipped;
  }
  Jobs jobs{.triad_elems = o.triad_elems, .triad_launches = o.triad_launches, .fma_blocks = (*h)->sm_count() * 8};
  auto table = measure(**dev, nullptr, o, jobs, [&](StreamId plain) -> base::Result<std::unique_ptr<Runner>> {
    auto r = CudaRunner::create(**dev, **h, jobs, plain);
    if (!r) return std::unexpected(r.error());
    return std::unique_ptr<Runner>(std::move(*r));
  });
  if (!table) {
    fmt::print(stderr, "gpu_bench: {}\n", table.error().message());
    return 1;
  }
  print_table(*table, o);
  return 0;
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  try {
    tandem::bench::Options options;
    switch (tandem::bench::parse_args(argc, argv, options)) {
      case 1:
        return 0;
      case 2:
        return 2;
      default:
        break;
    }
    return options.sim ? tandem::bench::run_sim(options) : tandem::bench::run_cuda(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 1;
  }
}
