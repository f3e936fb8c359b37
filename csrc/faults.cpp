// Faults at tpu addresses: a SIGSEGV/SIGBUS handler that says so when a kernel touched a tpu
// tensor's data as host memory.
#include <signal.h>
#include <unistd.h>

#include "shim.h"

namespace torchtpu {
namespace {
// A kernel that reads or writes a tpu tensor's data pointer as host memory faults in the
// reserved region (abi.h). Say so, then hand the fault to the handler installed before ours
// (Python's faulthandler prints the Python stack) or to the default action: returning re-runs
// the faulting access, which faults again into that handler.

struct sigaction previous_segv, previous_bus;
size_t region_base = 0, region_len = 0;

void on_fault(int sig, siginfo_t* info, void*) {
  auto address = reinterpret_cast<size_t>(info->si_addr);
  if (region_len && address - region_base < region_len) {
    static const char message[] =
        "\ntorchtpu: a kernel read or wrote the data of a tpu tensor as host memory (the address is a "
        "tpu device address; tpu tensors have no host memory). The op needs a tpu kernel: report it, "
        "or move its inputs to the CPU to run it there.\n";
    (void)!write(2, message, sizeof message - 1);
  }
  sigaction(sig, sig == SIGBUS ? &previous_bus : &previous_segv, nullptr);
}
}  // namespace

void install_fault_handler() {
  tt_address_region(&region_base, &region_len);
  struct sigaction action {};
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, &previous_segv);
  sigaction(SIGBUS, &action, &previous_bus);
}

}  // namespace torchtpu
