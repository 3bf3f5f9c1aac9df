// Host NUMA topology through hwloc, checked against libnuma's view of the same machine.
#include <gtest/gtest.h>
#include <numa.h>
#include <pthread.h>
#include <sched.h>

#include <thread>

#include "device/topology.hpp"
#include "stowage/device.hpp"
#include "stowage/emulated_device.hpp"
#include "stowage/topology.hpp"

namespace stowage {
namespace {

TEST(Topology, CountsTheNumaNodesLibnumaSees) {
  const int n = numa_node_count();
  ASSERT_GE(n, 1);
  if (numa_available() >= 0) EXPECT_EQ(n, numa_num_configured_nodes());
}

TEST(Topology, ThreadPinnedToACpuReportsThatCpusNode) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed)) ++cpu;  // the first CPU this process may use
  ASSERT_LT(cpu, CPU_SETSIZE);
  int expected = 0;
  if (numa_available() >= 0) expected = numa_node_of_cpu(cpu);
  std::vector<int> seen;
  std::thread t([&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) return;  // seen stays empty
    seen = current_thread_numa_nodes();
  });
  t.join();
  ASSERT_FALSE(seen.empty());
  // Bound to one CPU: exactly that CPU's node (hwloc and libnuma agree), or, on a one-node
  // machine where binding to a CPU still spans every node, that single node.
  EXPECT_EQ(seen, std::vector<int>{expected});
}

TEST(Topology, UnboundThreadReportsNodesThatExist) {
  const auto nodes = current_thread_numa_nodes();
  ASSERT_FALSE(nodes.empty());
  for (int node : nodes) {
    EXPECT_GE(node, 0);
    EXPECT_LT(node, numa_node_count());
  }
}

TEST(Topology, UnknownPciDeviceHasNoNearestNode) {
  EXPECT_TRUE(detail::numa_nodes_near_pci("ffff:ff:1f.7").empty());
  EXPECT_TRUE(detail::numa_nodes_near_pci("").empty());
  EXPECT_TRUE(detail::numa_nodes_near_pci("not a bus id").empty());
}

TEST(Topology, NearestNodesOfADeviceAreItsProperties) {
  EmulatedOptions o;
  o.capacity = std::size_t{16} << 20;
  auto dev = make_emulated_device(0, o);
  EXPECT_EQ(nearest_numa_nodes(*dev), dev->properties().numa_nodes);
  ASSERT_FALSE(dev->properties().numa_nodes.empty());
  for (int node : dev->properties().numa_nodes) EXPECT_LT(node, numa_node_count());
}

}  // namespace
}  // namespace stowage
