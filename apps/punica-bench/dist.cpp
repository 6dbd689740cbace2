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
#include <vector>
#include "kernels/common/error.h"

namespace punica::bench {
namespace {
Dist* g_dist = nullptr;
std::atomic<double> g_deadline{0.0};
std::mutex g_what_mu;
std::string g_what;
std::atomic<bool> g_watchdog_on{false};
std::mutex g_wd_mu;  // held by the watchdog thread while it calls MPI, and by finalize from then on
std::atomic<double> g_armed_at{0.0}, g_armed_s{0.0};
MPI_Comm g_wd_comm = MPI_COMM_NULL;  // the watchdogs' own communicator: "are you there?" pings
bool g_wd_threads = false;           // MPI_THREAD_MULTIPLE provided: the watchdog thread may call MPI
constexpr int kTagPing = 4301, kTagPong = 4302, kWhereLen = 400;
constexpr double kPingWait_s = 3.0;  // how long a timed-out rank waits for the others' answers
std::atomic<const char*> g_collective{nullptr};  // the collective the main thread waits in, if any
struct InCollective {  // marks the span of one blocking collective for where()
  explicit InCollective(const char* name) { g_collective = name; }
  ~InCollective() { g_collective = nullptr; }
};

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

int Dist::launch_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* r = std::getenv(v)) return std::atoi(r);
  return 0;
}

Dist& Dist::init(int* argc, char*** argv) {
  if (g_dist) return *g_dist;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  }
  int level = 0;
  MPI_Query_thread(&level);
  g_wd_threads = level == MPI_THREAD_MULTIPLE;
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
  if (d->size_ > 1 && g_wd_threads) mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &g_wd_comm), "MPI_Comm_dup");
  g_dist = d;
  return *d;
}

Dist* Dist::instance() { return g_dist; }

void Dist::finalize() {
  g_watchdog_on = false;
  g_wd_mu.lock();  // the watchdog thread makes no MPI call from here on (never unlocked)
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Finalize();
}

int Dist::allreduce_max(int v) const {
  InCollective busy("MPI_Allreduce");
  int out = v;
  mpi_check(MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  return out;
}
int64_t Dist::allreduce_sum(int64_t v) const {
  InCollective busy("MPI_Allreduce");
  int64_t out = v;
  mpi_check(MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  return out;
}
double Dist::allreduce_max(double v) const {
  InCollective busy("MPI_Allreduce");
  double out = v;
  mpi_check(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  return out;
}
double Dist::allreduce_sum(double v) const {
  InCollective busy("MPI_Allreduce");
  double out = v;
  mpi_check(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  return out;
}
void Dist::allreduce_max_inplace(std::vector<double>& v) const {
  InCollective busy("MPI_Allreduce");
  if (v.empty()) return;
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, v.data(), int(v.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
            "MPI_Allreduce");
}
std::vector<std::string> Dist::gather_strings(const std::string& s) const {
  InCollective busy("MPI_Gather");
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
void Dist::barrier() const {
  InCollective busy("MPI_Barrier");
  mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

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
  InCollective busy("MPI_Allgather");
  MPI_Comm c = *static_cast<MPI_Comm*>(group_comm(group_size));
  mpi_check(MPI_Allgather(in, int(count), MPI_FLOAT, out, int(count), MPI_FLOAT, c), "MPI_Allgather");
}
void Dist::group_all_reduce_sum_f32(float* inout, std::size_t count, int group_size) const {
  InCollective busy("MPI_Allreduce");
  MPI_Comm c = *static_cast<MPI_Comm*>(group_comm(group_size));
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, inout, int(count), MPI_FLOAT, MPI_SUM, c), "MPI_Allreduce");
}
void Dist::group_bcast(void* data, std::size_t bytes, int group_size) const {
  InCollective busy("MPI_Bcast");
  MPI_Comm c = *static_cast<MPI_Comm*>(group_comm(group_size));
  mpi_check(MPI_Bcast(data, int(bytes), MPI_BYTE, 0, c), "MPI_Bcast");
}

void Dist::abort(int code, const std::string& msg) const {
  std::fprintf(stderr, "punica-bench: [rank %d/%d] %s\n", rank_, size_, msg.c_str());
  std::fflush(stderr);
  if (size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

// What this rank is doing, for a timed-out rank's message: "in case 'X' (12.3 s)" or "between cases".
std::string Dist::where() const {
  std::string what;
  {
    std::lock_guard<std::mutex> lk(g_what_mu);
    what = g_what;
  }
  const double at = g_armed_at.load();
  const char* coll = g_collective.load();
  const std::string waiting = coll ? std::string(", waiting in ") + coll : ", working";
  if (g_deadline.load() <= 0 || at <= 0)
    return (what.empty() ? "not in a case" : "between cases, after " + what) + (coll ? waiting : "");
  char b[48];
  std::snprintf(b, sizeof b, " (for %.1f s", now_s() - at);
  return "in " + what + b + waiting + ")";
}

// Answers every waiting "are you there?" ping with where this rank is (watchdog thread only).
void Dist::answer_pings() const {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kTagPing, g_wd_comm, &flag, &st) != MPI_SUCCESS || !flag) return;
    int dummy = 0;
    MPI_Recv(&dummy, 1, MPI_INT, st.MPI_SOURCE, kTagPing, g_wd_comm, MPI_STATUS_IGNORE);
    std::string w = where();
    w.resize(kWhereLen, '\0');
    MPI_Send(w.data(), kWhereLen, MPI_CHAR, st.MPI_SOURCE, kTagPong, g_wd_comm);  // small: sent eagerly
  }
}

// This rank ran past its deadline: ask every other rank where it is (kPingWait_s), name the ones that
// do not answer (stopped, e.g. SIGSTOP, or dead), and end every rank with exit 5.
void Dist::timed_out() const {
  std::string what, msg;
  {
    std::lock_guard<std::mutex> lk(g_what_mu);
    what = g_what;
  }
  char b[96];
  std::snprintf(b, sizeof b, " ran past --timeout %g s on rank %d", g_armed_s.load(), rank_);
  msg = "timeout: " + what + b;
  if (const char* coll = g_collective.load()) msg += std::string(" (waiting in ") + coll + ")";
  if (size_ > 1 && g_wd_comm != MPI_COMM_NULL) {
    const int n = size_;
    std::vector<MPI_Request> recv(n, MPI_REQUEST_NULL), send(n, MPI_REQUEST_NULL);
    std::vector<std::vector<char>> buf(n, std::vector<char>(kWhereLen + 1, '\0'));
    int ping = 1;
    for (int r = 0; r < n; ++r) {
      if (r == rank_) continue;
      MPI_Irecv(buf[r].data(), kWhereLen, MPI_CHAR, r, kTagPong, g_wd_comm, &recv[r]);
      MPI_Isend(&ping, 1, MPI_INT, r, kTagPing, g_wd_comm, &send[r]);
    }
    std::vector<int> answered(n, 0);
    answered[rank_] = 1;
    const double until = now_s() + kPingWait_s;
    int pending = n - 1;
    while (pending > 0 && now_s() < until) {
      answer_pings();  // another rank may be timing out too and asking this one
      for (int r = 0; r < n; ++r) {
        if (answered[r]) continue;
        int done = 0;
        MPI_Test(&recv[r], &done, MPI_STATUS_IGNORE);
        if (done) { answered[r] = 1; --pending; }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::string silent, others;
    for (int r = 0; r < n; ++r) {
      if (r == rank_) continue;
      if (!answered[r]) silent += (silent.empty() ? "" : ", ") + std::to_string(r);
      else others += "; rank " + std::to_string(r) + " is " + std::string(buf[r].data());
    }
    if (!silent.empty()) {
      std::snprintf(b, sizeof b, " stopped answering (no reply in %g s: stopped or dead)", kPingWait_s);
      msg += std::string("; rank") + (silent.find(',') != std::string::npos ? "s " : " ") + silent + b;
    }
    msg += others;
  }
  abort(5, msg + "; aborting every rank");
}

void Dist::start_watchdog() {
  if (g_watchdog_on.exchange(true)) return;
  std::thread([this] {
    while (g_watchdog_on) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::lock_guard<std::mutex> lk(g_wd_mu);
      if (!g_watchdog_on) break;
      if (g_wd_comm != MPI_COMM_NULL) answer_pings();
      double dl = g_deadline.load();
      if (dl > 0 && now_s() > dl) timed_out();
    }
  }).detach();
}
void Dist::arm(double seconds, const std::string& what) {
  {
    std::lock_guard<std::mutex> lk(g_what_mu);
    g_what = what;
  }
  g_armed_s = seconds;
  g_armed_at = now_s();
  g_deadline = seconds > 0 ? now_s() + seconds : 0.0;
}
void Dist::disarm() { g_deadline = 0.0; }

}  // namespace punica::bench
