// Process group for mpirun launches (DESIGN §8): rank/size/local rank, rank agreement (status
// all-reduce after every case, broadcasts from rank 0), CPU collectives for the CPU backend, a
// watchdog that aborts every rank on a hang, and abort-with-message. The only user of mpi.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace punica::bench {

class Dist {
 public:
  // Initialises MPI (threads: multiple, for the watchdog). Safe to call without mpirun.
  static Dist& init(int* argc, char*** argv);
  static Dist* instance();  // nullptr before init
  static void finalize();
  // True when the environment says we were launched by a multi-process launcher.
  static bool launched_by_mpirun();
  // This process's rank as the launcher's environment gives it, before init (0 when not launched).
  static int launch_rank();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  std::string host() const { return host_; }
  std::string mpi_version() const { return mpi_version_; }

  int allreduce_max(int v) const;
  int64_t allreduce_sum(int64_t v) const;
  double allreduce_max(double v) const;
  double allreduce_sum(double v) const;
  void allreduce_max_inplace(std::vector<double>& v) const;
  std::vector<std::string> gather_strings(const std::string& s) const;  // rank 0 gets all
  void barrier() const;

  // Collectives inside a TP group of `group_size` consecutive ranks (group = rank / group_size).
  // fp32 all-gather: each rank contributes `count` floats; out has group_size*count floats.
  void group_all_gather_f32(const float* in, float* out, std::size_t count, int group_size) const;
  void group_all_reduce_sum_f32(float* inout, std::size_t count, int group_size) const;
  void group_bcast(void* data, std::size_t bytes, int group_size) const;  // from group rank 0

  // Ends every rank now with `code` after printing `msg` (to stderr, prefixed with the rank).
  [[noreturn]] void abort(int code, const std::string& msg) const;

  // Watchdog: after arm(seconds, what) a rank still armed past the deadline (in the work or in a
  // collective, e.g. waiting for a rank that stopped) asks every other rank where it is, names the
  // ones that do not answer, and aborts every rank with exit 5. `what` names the work ("case 'ID'").
  void start_watchdog();
  void arm(double seconds, const std::string& what);
  void disarm();

 private:
  Dist() = default;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  std::string host_, mpi_version_;
  void* group_comm_cache_ = nullptr;
  int group_comm_size_ = 0;
  void* group_comm(int group_size) const;
  std::string where() const;
  void answer_pings() const;
  [[noreturn]] void timed_out() const;
};

}  // namespace punica::bench
