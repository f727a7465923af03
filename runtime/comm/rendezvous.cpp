#include "runtime/comm/rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>

#include "runtime/error.h"

namespace cutrain::comm {

namespace {
using Clock = std::chrono::steady_clock;

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd(const Fd&) = delete;
};

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

void io_all(int fd, void* buf, std::size_t n, bool send, Clock::time_point deadline, const char* what) {
  auto* p = static_cast<char*>(buf);
  while (n) {
    pollfd pf{fd, static_cast<short>(send ? POLLOUT : POLLIN), 0};
    int pr = ::poll(&pf, 1, remaining_ms(deadline));
    CUTRAIN_CHECK(pr > 0, "rendezvous: timed out while ", what);
    ssize_t r = send ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    CUTRAIN_CHECK(r > 0, "rendezvous: connection lost while ", what, r < 0 ? ": " : "", r < 0 ? std::strerror(errno) : "");
    p += r;
    n -= static_cast<std::size_t>(r);
  }
}

sockaddr_in resolve(const LaunchEnv& env) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(env.master_addr.c_str(), nullptr, &hints, &res);
  CUTRAIN_CHECK(rc == 0 && res, "rendezvous: cannot resolve MASTER_ADDR '", env.master_addr, "': ", gai_strerror(rc));
  sockaddr_in a = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  a.sin_port = htons(static_cast<std::uint16_t>(env.port()));
  return a;
}

bool is_loopback(const sockaddr_in& a) { return (ntohl(a.sin_addr.s_addr) >> 24) == 127; }

constexpr std::uint32_t kMagic = 0x63747276;  // "ctrv"
}  // namespace

std::vector<char> rendezvous_broadcast(const LaunchEnv& env, const std::vector<char>& blob,
                                       std::chrono::milliseconds timeout) {
  if (env.world_size == 1) return blob;
  const auto deadline = Clock::now() + timeout;
  const sockaddr_in addr = resolve(env);
  const std::string where = env.master_addr + ":" + std::to_string(env.port()) + " (port from " +
                            env.rendezvous_port_from + ")";
  if (env.rank == 0) {
    Fd ls(::socket(AF_INET, SOCK_STREAM, 0));
    CUTRAIN_CHECK(ls.fd >= 0, "rendezvous: socket(): ", std::strerror(errno));
    int one = 1;
    ::setsockopt(ls.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    // A loopback MASTER_ADDR (one node) listens on that address only; any other on every interface,
    // since the peers connect from other hosts.
    sockaddr_in bind_addr = addr;
    if (!is_loopback(addr)) bind_addr.sin_addr.s_addr = htonl(INADDR_ANY);
    if (::bind(ls.fd, reinterpret_cast<const sockaddr*>(&bind_addr), sizeof bind_addr) != 0) {
      const int err = errno;
      const std::string holder = env.rendezvous_port_from == "MASTER_PORT"
                                     ? " (torchrun's or PyTorch's TCPStore, or another job)"
                                     : " (another job)";
      CUTRAIN_FAIL("rendezvous: rank 0 cannot listen on port ", env.port(), ", the port from ", env.rendezvous_port_from,
                   ": ", std::strerror(err),
                   err == EADDRINUSE ? "; another process already listens there" + holder +
                                           ": set CUTRAIN_RENDEZVOUS_PORT to a free port (the same on every rank) or "
                                           "choose another MASTER_PORT"
                                     : std::string());
    }
    CUTRAIN_CHECK(::listen(ls.fd, 1024) == 0, "rendezvous: listen(): ", std::strerror(errno));
    std::vector<bool> seen(env.world_size, false);
    seen[0] = true;
    int arrived = 1;
    std::vector<Fd> peers;
    while (arrived < env.world_size) {
      pollfd pf{ls.fd, POLLIN, 0};
      int pr = ::poll(&pf, 1, remaining_ms(deadline));
      if (pr <= 0) {
        std::string missing;
        for (int r = 0; r < env.world_size; ++r)
          if (!seen[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        CUTRAIN_FAIL("rendezvous: rank 0 waited ", timeout.count() / 1000.0, " s at ", where, " but only ", arrived,
                     " of ", env.world_size, " ranks arrived; missing ranks: ", missing);
      }
      Fd c(::accept(ls.fd, nullptr, nullptr));
      if (c.fd < 0) continue;
      std::uint32_t hello[3];  // magic, rank, world size
      io_all(c.fd, hello, sizeof hello, false, deadline, "reading a peer's hello");
      CUTRAIN_CHECK(hello[0] == kMagic, "rendezvous: a connection to ", where, " did not speak the cutrain protocol");
      CUTRAIN_CHECK(static_cast<int>(hello[2]) == env.world_size, "rendezvous: rank ", hello[1], " says WORLD_SIZE=",
                    hello[2], " but rank 0 has ", env.world_size);
      CUTRAIN_CHECK(hello[1] < seen.size() && !seen[hello[1]], "rendezvous: rank ", hello[1],
                    hello[1] < seen.size() ? " arrived twice" : " is out of range");
      seen[hello[1]] = true;
      ++arrived;
      peers.push_back(std::move(c));
    }
    const std::uint32_t len = static_cast<std::uint32_t>(blob.size());
    for (auto& p : peers) {
      io_all(p.fd, const_cast<std::uint32_t*>(&len), sizeof len, true, deadline, "sending the id");
      io_all(p.fd, const_cast<char*>(blob.data()), blob.size(), true, deadline, "sending the id");
    }
    for (auto& p : peers) {  // wait for each ack so nobody exits before everyone has the id
      char ack;
      io_all(p.fd, &ack, 1, false, deadline, "waiting for acknowledgements");
    }
    return blob;
  }
  // Other ranks: connect with retries (rank 0 may not be listening yet).
  for (;;) {
    Fd s(::socket(AF_INET, SOCK_STREAM, 0));
    CUTRAIN_CHECK(s.fd >= 0, "rendezvous: socket(): ", std::strerror(errno));
    if (::connect(s.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
      std::uint32_t hello[3] = {kMagic, static_cast<std::uint32_t>(env.rank), static_cast<std::uint32_t>(env.world_size)};
      io_all(s.fd, hello, sizeof hello, true, deadline, "sending hello to rank 0");
      std::uint32_t len = 0;
      io_all(s.fd, &len, sizeof len, false, deadline, "waiting for rank 0 to send the id (are all ranks started?)");
      CUTRAIN_CHECK(len < (1u << 20), "rendezvous: implausible id length ", len);
      std::vector<char> out(len);
      io_all(s.fd, out.data(), len, false, deadline, "receiving the id");
      char ack = 1;
      io_all(s.fd, &ack, 1, true, deadline, "acknowledging");
      return out;
    }
    const int err = errno;
    CUTRAIN_CHECK(remaining_ms(deadline) > 0, "rendezvous: rank ", env.rank, " could not reach rank 0 at ", where,
                  " within ", timeout.count() / 1000.0, " s: ", std::strerror(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace cutrain::comm
