/* trace-canopy.C: Canopy's Charm++ trace module. A program linked with `charmc -tracemode canopy` reports to the
 * node's Canopy agent (CANOPY_AGENT_SOCKET) with no source change:
 *
 * - each PE is a rank (CkMyPe() of CkNumPes()), the application the program's name;
 * - each entry method is an activity named `Chare::entry` from Charm++'s registration (the names Projections
 *   shows), timed from its begin to its end of execution; the scheduler's idle time is the activity `Idle`;
 * - each message created counts in `charm_messages_created` and its bytes in `charm_bytes_created` (Charm++
 *   routes a message after it is created, so its destination PE is not known here);
 * - user events count in `charm_user_event <name>`, user brackets are activities of their name;
 * - the SDK dumps every CANOPY_DUMP_PERIOD_MS (1000 by default) from its own thread, with the profile and
 *   utilization modules unless CANOPY_MODULES says otherwise, and once more when the computation ends.
 *
 * The module loads Canopy's C SDK (libcanopy) when the program starts: CANOPY_LIBRARY names it, else the path
 * sdk/charm/install.sh compiled in, else `libcanopy.so.0` from the loader's search path. Without it the program
 * runs as it would without the module, and says so once on stderr. In an SMP build the PEs of a process are
 * threads of one rank (the process: CkMyNode() of CkNumNodes()), each with its own stack of entry methods. */

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <string>
#include <vector>

#include "charm++.h"
#include "envelope.h"
#include "register.h"
#include "trace-common.h"
#include "trace.h"

#ifndef CANOPY_DEFAULT_LIBRARY
#define CANOPY_DEFAULT_LIBRARY "libcanopy.so.0"
#endif

namespace {

/* The entry points of the C SDK this module calls (canopy.h). */
struct Sdk {
  int (*init)(const char *, int, int);
  int (*activity)(const char *);
  void (*begin)(int);
  void (*end)(int);
  void (*idle_begin)(void);
  void (*idle_end)(void);
  int (*counter_id)(const char *);
  void (*count)(int, double);
  int (*dump)(void);
  int (*finalize)(void);
  const char *(*last_error)(void);
};

Sdk sdk;
bool sdk_loaded = false;

template <typename F>
bool resolve(void *lib, const char *name, F *out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

/* Loads the SDK; false (said once) when it cannot be found. */
bool load_sdk_now() {
  const char *path = getenv("CANOPY_LIBRARY");
  if (path == nullptr || *path == '\0') path = CANOPY_DEFAULT_LIBRARY;
  void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) {
    std::string first = dlerror();
    if (strcmp(path, "libcanopy.so.0") != 0) lib = dlopen("libcanopy.so.0", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) {
      fprintf(stderr, "canopy-charm: Canopy's C SDK could not be loaded (%s): this run is not monitored; set "
                      "CANOPY_LIBRARY to libcanopy.so\n", first.c_str());
      return false;
    }
  }
  bool ok = resolve(lib, "canopy_init", &sdk.init) && resolve(lib, "canopy_activity", &sdk.activity) &&
            resolve(lib, "canopy_begin", &sdk.begin) && resolve(lib, "canopy_end", &sdk.end) &&
            resolve(lib, "canopy_idle_begin", &sdk.idle_begin) && resolve(lib, "canopy_idle_end", &sdk.idle_end) &&
            resolve(lib, "canopy_counter_id", &sdk.counter_id) && resolve(lib, "canopy_count", &sdk.count) &&
            resolve(lib, "canopy_dump", &sdk.dump) && resolve(lib, "canopy_finalize", &sdk.finalize) &&
            resolve(lib, "canopy_last_error", &sdk.last_error);
  if (!ok) {
    fprintf(stderr, "canopy-charm: %s lacks the SDK's entry points: this run is not monitored\n", path);
    return false;
  }
  sdk_loaded = true;
  return true;
}

/* Loads the SDK once per process: the PEs of an SMP process begin together, and each waits for the load. */
bool load_sdk() {
  static std::once_flag once;
  std::call_once(once, [] { load_sdk_now(); });
  return sdk_loaded;
}

/* The program's name, from its path. */
std::string program_name(char **argv) {
  if (argv == nullptr || argv[0] == nullptr) return "charm";
  const char *slash = strrchr(argv[0], '/');
  return slash != nullptr ? slash + 1 : argv[0];
}

/* `Chare::entry` for entry point EP, as Charm++ registered both. */
std::string entry_name(int ep) {
  if (ep < 0 || (size_t)ep >= _entryTable.size()) return "unknown entry";
  const EntryInfo *e = _entryTable[ep];
  std::string chare = "?";
  if (e->chareIdx >= 0 && (size_t)e->chareIdx < _chareTable.size()) chare = _chareTable[e->chareIdx]->name;
  return chare + "::" + e->name;
}

}  // namespace

/* One per PE: the activity ids of the entry methods it ran, and the stack of those it runs (an entry method may
 * run another's code inline, and threaded entry methods suspend). */
class TraceCanopy : public Trace {
 public:
  explicit TraceCanopy(char **argv) : app_(program_name(argv)) {}

  void beginComputation() override {
    if (!load_sdk()) return;
    started_ = start();
    if (started_) {
      created_ = sdk.counter_id("charm_messages_created");
      created_bytes_ = sdk.counter_id("charm_bytes_created");
    }
  }

  void beginExecute(envelope *e, void *) override {
    if (e == nullptr)
      enter(_threadEP);
    else
      enter(e->getEpIdx());
  }
  void beginExecute(CmiObjId *) override { enter(_threadEP); }
  void beginExecute(int, int, int ep, int, int, CmiObjId *, void *) override { enter(ep); }
  void endExecute() override { leave(); }

  void beginIdle(double) override {
    if (started_ && !idle_) {
      idle_ = true;
      sdk.idle_begin();
    }
  }
  void endIdle(double) override {
    if (started_ && idle_) {
      idle_ = false;
      sdk.idle_end();
    }
  }

  void creation(envelope *e, int, int num) override { created(e, num); }
  void creationMulticast(envelope *e, int, int num, const int *) override { created(e, num); }

  /* An event id as Projections assigns them (the one asked for, or one past the largest), so that both
   * modules agree when they run together. */
  int traceRegisterUserEvent(const char *name, int e) override {
    if (name == nullptr) return e;
    if (e < 0) e = (int)user_names_.size();
    if ((size_t)e >= user_names_.size()) user_names_.resize(e + 1);
    user_names_[e] = name;
    return e;
  }
  void userEvent(int id) override {
    if (!started_) return;
    int c = sdk.counter_id(("charm_user_event " + user_name(id)).c_str());
    if (c >= 0) sdk.count(c, 1.0);
  }
  void beginUserBracketEvent(int id, int) override {
    if (started_) sdk.begin(activity(user_name(id)));
  }
  void endUserBracketEvent(int id, int) override {
    if (started_) sdk.end(activity(user_name(id)));
  }

  void endComputation() override { finish(); }
  void traceClose() override {
    finish();
    CkpvAccess(_traces)->removeTrace(this);
  }

 private:
  bool start() {
    int rank = CkMyPe(), size = CkNumPes();
#if CMK_SMP
    // PEs of one process share it: the process is the rank, its PEs are threads of it.
    rank = CkMyNode();
    size = CkNumNodes();
    // The SDK takes activities and events from any thread before and after its start.
    if (CkMyRank() != 0) return true;
#endif
    setenv("CANOPY_DUMP_PERIOD_MS", "1000", 0);
    setenv("CANOPY_MODULES", "profile,utilization", 0);
    if (sdk.init(app_.c_str(), rank, size) != 0) {
      fprintf(stderr, "canopy-charm: PE %d: canopy_init failed: %s\n", CkMyPe(), sdk.last_error());
      return false;
    }
    return true;
  }

  void enter(int ep) {
    if (!started_) return;
    int id = activity_of(ep);
    stack_.push_back(id);
    if (id >= 0) sdk.begin(id);
  }

  void leave() {
    if (!started_ || stack_.empty()) return;
    int id = stack_.back();
    stack_.pop_back();
    if (id >= 0) sdk.end(id);
  }

  void created(envelope *e, int num) {
    if (!started_ || num <= 0) return;
    if (created_ >= 0) sdk.count(created_, (double)num);
    if (created_bytes_ >= 0 && e != nullptr) sdk.count(created_bytes_, (double)e->getTotalsize() * num);
  }

  int activity_of(int ep) {
    if (ep < 0) return -1;
    if ((size_t)ep >= entry_ids_.size()) entry_ids_.resize(ep + 1, -2);
    if (entry_ids_[ep] == -2) entry_ids_[ep] = sdk.activity(entry_name(ep).c_str());
    return entry_ids_[ep];
  }

  int activity(const std::string &name) { return sdk.activity(name.c_str()); }

  std::string user_name(int id) const {
    if (id >= 0 && (size_t)id < user_names_.size() && !user_names_[id].empty()) return user_names_[id];
    return "user event " + std::to_string(id);
  }

  void finish() {
    if (!started_) return;
    while (!stack_.empty()) leave();
    if (idle_) endIdle(0.0);
    started_ = false;
#if CMK_SMP
    if (CkMyRank() != 0) return;
#endif
    if (sdk.finalize() != 0) fprintf(stderr, "canopy-charm: PE %d: canopy_finalize: %s\n", CkMyPe(), sdk.last_error());
  }

  std::string app_;
  bool started_ = false, idle_ = false;
  int created_ = -1, created_bytes_ = -1;
  std::vector<int> entry_ids_;
  std::vector<int> stack_;
  std::vector<std::string> user_names_;
};

CkpvStaticDeclare(TraceCanopy *, _canopyTrace);

/* Called by the program's module initialization that charmc writes for `-tracemode canopy`. */
void _createTracecanopy(char **argv) {
  CkpvInitialize(TraceCanopy *, _canopyTrace);
  CkpvAccess(_canopyTrace) = new TraceCanopy(argv);
  CkpvAccess(_traces)->addTrace(CkpvAccess(_canopyTrace));
}
