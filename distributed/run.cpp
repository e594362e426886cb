// run_or_abort: the one place where a rank's exception becomes the end of the job.
#include "distributed/run.h"

#include <exception>
#include <string>

namespace minidl::distributed {
namespace {
ProcessGroup* g_group = nullptr;

[[noreturn]] void on_terminate() {
  std::string what = "std::terminate called";
  if (const std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
      what = "an exception that is not a std::exception";
    }
  }
  g_group->abort(what);
}
}  // namespace

int run_or_abort(const std::function<int()>& body, ProcessGroup& group) {
  g_group = &group;
  std::set_terminate(on_terminate);
  try {
    return body();
  } catch (const std::exception& e) {
    group.abort(e.what());
  } catch (...) {
    group.abort("an exception that is not a std::exception");
  }
}

}  // namespace minidl::distributed
