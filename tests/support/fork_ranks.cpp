#include "tests/support/fork_ranks.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <exception>

#include "tests/support/test_support.h"

namespace cutrain::test {

std::vector<std::string> fork_ranks(int world, const std::function<void(int rank, int port)>& body) {
  const int port = free_tcp_port();
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (int r = 0; r < world; ++r) {
    int p[2];
    EXPECT_EQ(::pipe(p), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      std::string msg;
      try {
        body(r, port);
      } catch (const std::exception& ex) {
        msg = ex.what();
        if (msg.empty()) msg = "(empty error)";
      }
      if (::write(p[1], msg.data(), msg.size()) < 0) ::_exit(2);
      ::_exit(0);
    }
    ::close(p[1]);
    pids.push_back(pid);
    fds.push_back(p[0]);
  }
  std::vector<std::string> out(static_cast<std::size_t>(world));
  for (std::size_t r = 0; r < out.size(); ++r) {
    char buf[4096];
    for (ssize_t k; (k = ::read(fds[r], buf, sizeof buf)) > 0;) out[r].append(buf, std::size_t(k));
    ::close(fds[r]);
    int st = 0;
    ::waitpid(pids[r], &st, 0);
  }
  return out;
}

void expect_all_ok(const std::vector<std::string>& outcomes) {
  for (std::size_t r = 0; r < outcomes.size(); ++r) EXPECT_EQ(outcomes[r], "") << "rank " << r;
}

}  // namespace cutrain::test
