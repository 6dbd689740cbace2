// What a registry entry (registry.h) makes of a case: a Problem — named host tensors generated
// from the counter-based hash, how to run the op on a Backend, the reference (Eigen or naive
// fp64), the bytes/FLOPs that must move, and the cuBLAS baseline shapes.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "apps/punica-bench/backend/backend.h"
#include "kernels/lora_meta/lora_meta.h"
#include "apps/punica-bench/registry.h"
#include "apps/punica-bench/scenario.h"

namespace punica::bench {

enum class Role { input, output, scratch };

struct HostTensor {
  std::string name;
  kernels::DType dtype = kernels::DType::f32;
  bool is_int = false;                 // int32 data (dtype ignored)
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;           // initial contents (inputs, y0 of outputs; scratch: none)
  Role role = Role::input;
  // outputs: element idx belongs to token/row (idx / inner) % rows (for --sample-rows)
  int64_t rows = 0, inner = 1;
  std::vector<uint8_t> must_keep;      // outputs: 1 = must stay bit-equal to the initial value
  std::size_t scratch_bytes = 0;       // scratch: size

  std::size_t elem_bytes() const { return is_int ? 4 : kernels::dtype_size(dtype); }
  std::size_t numel() const {
    std::size_t n = 1;
    for (auto d : shape) n *= std::size_t(d);
    return n;
  }
  std::size_t bytes() const { return role == Role::scratch ? scratch_bytes : numel() * elem_bytes(); }
};

// Indices (into Problem::tensors) of the LoRAKernelMeta tensors of a problem, and the Args/View
// built from a set of pointers. Shared by the op problems and the layers.
struct MetaTensors {
  int mapping = -1, tlm = -1, sorted = -1, active = -1, counts = -1, start = -1, nolora = -1,
      nactive = -1, ws = -1;
  std::size_t ws_bytes = 0;
  int64_t T = 0;
  int L = 0;
  kernels::LoraMetaArgs args(const std::vector<void*>& p) const;
  kernels::LoraMetaView view(const std::vector<void*>& p) const;
};

struct Work {
  double bytes = 0;   // bytes that must move (DESIGN §7 formulas, true ranks, active adapters)
  double flops = 0;
  int64_t tokens = 0;
  double base_gemm_flops = 0;  // layers: the base GEMMs' FLOPs (the MoE layer's GEMM-rate fraction)
};

// cuBLAS doing the same work as the op (README, Baselines): an accumulating op's GEMMs accumulate
// (beta = 1: they read y as the op does); an op of two halves (shrink + expand) times both.
struct Baseline {
  struct Gemm {
    int64_t m, n, k;
    bool accumulate = false;
  };
  std::vector<Gemm> dense;  // summed (e.g. shrink GEMM + expand GEMM)
  struct Grouped {
    std::vector<Backend::Group> groups;  // one grouped call over the adapters
    bool accumulate = false;
  };
  std::vector<Grouped> grouped;  // summed (the shrink's call, then the expand's)
};

class Problem {
 public:
  virtual ~Problem() = default;
  std::vector<HostTensor> tensors;
  int mapping_tensor = -1;   // index of the per-row slot mapping (for --sample-rows), -1 = none
  // --sample-rows: rows the reference must compute (1 = sampled; empty = all). Filled by the runner
  // before reference(); layers use it because a row of slot -1 still has its base output.
  std::vector<uint8_t> row_sample;

  // Untimed preparation on the backend (e.g. the sorted-by-adapter metadata).
  virtual void prepare(Backend& be, const std::vector<void*>& p) {}
  // The timed op.
  virtual void run(Backend& be, const std::vector<void*>& p) = 0;
  // The reference on host pointers: Eigen (naive = false) or fp64 loops (naive = true).
  virtual void reference(const std::vector<void*>& p, bool naive) = 0;
  virtual Work work() const = 0;
  virtual Baseline baseline() const { return {}; }
  virtual double rtol() const;
  // Outputs whose contract is not element-wise (the MoE alignment: a group's entries in any order).
  // When this returns a value it replaces the element-wise comparison of every output: the runner
  // calls it with host copies of every tensor as the op left them (`actual`; inputs and scratch:
  // their initial contents) and as the reference left them (`expected`), and counts `nwrong` in the
  // case's check (the initial contents of the outputs are in `tensors`).
  struct CustomCheck {
    std::size_t nelems = 0, nwrong = 0;
    std::vector<std::string> failures;  // one line each (the result's first_mismatches)
  };
  virtual std::optional<CustomCheck> custom_check(const std::vector<const void*>& actual,
                                                  const std::vector<const void*>& expected) const {
    (void)actual;
    (void)expected;
    return std::nullopt;
  }
  virtual std::string describe() const { return ""; }  // one line for -v (besides the tensor shapes)
  // The kernel plan the op runs for this case on the CUDA backend under `--kernel` choice k
  // (recorded in the result as "plan"); empty where the entry does not describe one (layers).
  virtual std::string plan(const KernelChoice& k) const { return ""; }
  // Null pointers for every tensor: Args built from them carry the shapes a plan reads.
  std::vector<void*> nulls() const { return std::vector<void*>(tensors.size(), nullptr); }

  // Layer cases: parts of the forward timed like run() over the same rotated copies, reported as
  // timing.<name>_us ("base" = base GEMM alone, "lora" = the LoRA part with its collectives, and
  // one part per collective named in comms()).
  struct Part {
    std::string name;
    std::function<void(Backend&, const std::vector<void*>&)> body;
  };
  virtual std::vector<Part> parts() { return {}; }
  // Collectives of one forward (per rank): op (all_gather | all_reduce), bytes of the gathered /
  // reduced buffer, the group size, and the part that times it alone.
  struct Comm {
    std::string op;
    double bytes = 0;
    int tp = 1;
    std::string part;
  };
  virtual std::vector<Comm> comms() const { return {}; }
  kernels::DType dtype = kernels::DType::bf16;
};

struct ProblemOptions {
  bool nan_padding = false;  // fill A/B beyond each adapter's true rank with NaN (proves work ∝ rank)
  bool exact = false;        // small-integer inputs: any mismatch is a real bug
  std::string fault;         // test only: a sharding bug this rank's layer plants (--inject-fault RANK:moe_*)
};

// The registry entry of c.op makes the problem (registry.h).
std::unique_ptr<Problem> make_problem(const Case& c, const ProblemOptions& o = {});

}  // namespace punica::bench
