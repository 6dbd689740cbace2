// MPI process group, rank agreement, CPU collectives and the hang watchdog (see dist.h).
#include "apps/punica-bench/dist.h"
#include <mpi.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include "kernels/common/error.h"

namespace punica::bench {
namespace {
Dist* g_dist = nullptr;
std::atomic<double> g_deadline{0.0};
std::mutex g_what_mu;
std::string g_what;
std::atomic<bool> g_watchdog_on{false};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
void mpi_check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char buf[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, buf, &len);
    fail(ErrorKind::runtime, std::string("MPI error in ") + what + ": " + std::string(buf, len));
  }
}
}  // namespace

bool Dist::launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

Dist& Dist::init(int* argc, char*** argv) {
  if (g_dist) return *g_dist;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  auto* d = new Dist();
  MPI_Comm_rank(MPI_COMM_WORLD, &d->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &d->size_);
  MPI_Comm local;
  mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank_, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type");
  MPI_Comm_rank(local, &d->local_rank_);
  MPI_Comm_free(&local);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  d->host_.assign(name, len);
  char ver[MPI_MAX_LIBRARY_VERSION_STRING];
  MPI_Get_library_version(ver, &len);
  std::string v(ver, len);
  auto nl = v.find_first_of(",\n");
  d->mpi_version_ = nl == std::string::npos ? v : v.substr(0, nl);
  g_dist = d;
  return *d;
}

Dist* Dist::instance() { return g_dist; }

void Dist::finalize() {
  g_watchdog_on = false;
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Finalize();
}

int Dist::allreduce_max(int v) const {
  int out = v;
  mpi_check(MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  return out;
}
int64_t Dist::allreduce_sum(int64_t v) const {
  int64_t out = v;
  mpi_check(MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  return out;
}
double Dist::allreduce_max(double v) const {
  double out = v;
  mpi_check(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  return out;
}
double Dist::allreduce_sum(double v) const {
  double out = v;
  mpi_check(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  return out;
}
void Dist::allreduce_max_inplace(std::vector<double>& v) const {
  if (v.empty()) return;
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, v.data(), int(v.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
            "MPI_Allreduce");
}
std::vector<std::string> Dist::gather_strings(const std::string& s) const {
  int n = int(s.size());
  std::vector<int> lens(size_);
  mpi_check(MPI_Gather(&n, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Gather");
  std::vector<int> displs(size_, 0);
  int total = 0;
  for (int i = 0; i < size_; ++i) { displs[i] = total; total += lens[i]; }
  std::vector<char> all(std::max(total, 1));
  mpi_check(MPI_Gatherv(s.data(), n, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0,
                        MPI_COMM_WORLD), "MPI_Gatherv");
  std::vector<std::string> out;
  if (rank_ == 0)
    for (int i = 0; i < size_; ++i) out.emplace_back(all.data() + displs[i], lens[i]);
  return out;
}
void Dist::barrier() const { mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

void* Dist::group_comm(int group_size) const {
  auto* self = const_cast<Dist*>(this);
  if (group_comm_size_ != group_size) {
    if (group_comm_cache_) {
      MPI_Comm c = *static_cast<MPI_Comm*>(group_comm_cache_);
      MPI_Comm_free(&c);
      delete static_cast<MPI_Comm*>(group_comm_cache_);
      self->group_comm_cache_ = nullptr;
    }
    auto* c = new MPI_Comm;
    mpi_check(MPI_Comm_split(MPI_COMM_WORLD, rank_ / group_size, rank_, c), "MPI_Comm_split");
    self->group_comm_cache_ = c;
    self->group_comm_size_ = group_size;
  }
  return group_comm_cache_;
}
void Dist::group_all_gather_f32(const float* in, float* out, std::size_t count, int group_size) const {
  MPI_Comm c = *static_cast<MPI_Comm*>(group_comm(group_size));
  mpi_check(MPI_Allgather(in, int(count), MPI_FLOAT, out, int(count), MPI_FLOAT, c), "MPI_Allgather");
}
void Dist::group_all_reduce_sum_f32(float* inout, std::size_t count, int group_size) const {
  MPI_Comm c = *static_cast<MPI_Comm*>(group_comm(group_size));
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, inout, int(count), MPI_FLOAT, MPI_SUM, c), "MPI_Allreduce");
}
void Dist::group_bcast(void* data, std::size_t bytes, int group_size) const {
  MPI_Comm c = *static_cast<MPI_Comm*>(group_comm(group_size));
  mpi_check(MPI_Bcast(data, int(bytes), MPI_BYTE, 0, c), "MPI_Bcast");
}

void Dist::abort(int code, const std::string& msg) const {
  std::fprintf(stderr, "punica-bench: [rank %d/%d] %s\n", rank_, size_, msg.c_str());
  std::fflush(stderr);
  if (size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void Dist::start_watchdog() {
  if (g_watchdog_on.exchange(true)) return;
  std::thread([this] {
    while (g_watchdog_on) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      double dl = g_deadline.load();
      if (dl > 0 && now_s() > dl) {
        std::string what;
        {
          std::lock_guard<std::mutex> lk(g_what_mu);
          what = g_what;
        }
        abort(5, "timeout: '" + what + "' ran past --timeout; aborting every rank");
      }
    }
  }).detach();
}
void Dist::arm(double seconds, const std::string& what) {
  {
    std::lock_guard<std::mutex> lk(g_what_mu);
    g_what = what;
  }
  g_deadline = seconds > 0 ? now_s() + seconds : 0.0;
}
void Dist::disarm() { g_deadline = 0.0; }

}  // namespace punica::bench
