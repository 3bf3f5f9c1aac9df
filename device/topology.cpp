#include "device/topology.hpp"

#include <hwloc.h>

#include <mutex>

#include "stowage/topology.hpp"

namespace stowage::detail {
namespace {

// One topology per process, loaded on first use with PCI devices kept; hwloc allows concurrent
// read-only queries on a loaded topology.
class Topology {
 public:
  static Topology& get() {
    // Never destroyed: hwloc_topology_destroy unloads hwloc's plugins, which then show up as
    // leaks of an unknown module under LeakSanitizer; and devices may ask during static destruction.
    static Topology* instance = new Topology();
    return *instance;
  }
  hwloc_topology_t handle() const { return loaded_ ? topo_ : nullptr; }

 private:
  Topology() {
    if (hwloc_topology_init(&topo_) != 0) return;
    hwloc_topology_set_io_types_filter(topo_, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    loaded_ = hwloc_topology_load(topo_) == 0;
  }
  hwloc_topology_t topo_ = nullptr;
  bool loaded_ = false;
};

std::vector<int> to_vector(hwloc_const_nodeset_t nodeset) {
  std::vector<int> nodes;
  if (nodeset == nullptr) return nodes;
  unsigned index = 0;
  hwloc_bitmap_foreach_begin(index, nodeset) { nodes.push_back(static_cast<int>(index)); }
  hwloc_bitmap_foreach_end();
  return nodes;
}

struct Bitmap {
  hwloc_bitmap_t b = hwloc_bitmap_alloc();
  ~Bitmap() { hwloc_bitmap_free(b); }
};

}  // namespace

std::vector<int> numa_nodes_near_pci(const std::string& pci_bus_id) {
  hwloc_topology_t topo = Topology::get().handle();
  if (topo == nullptr || pci_bus_id.empty()) return {};
  hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(topo, pci_bus_id.c_str());
  if (pci == nullptr) return {};
  hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topo, pci);
  return ancestor ? to_vector(ancestor->nodeset) : std::vector<int>{};
}

std::vector<int> current_thread_numa_nodes() {
  hwloc_topology_t topo = Topology::get().handle();
  if (topo == nullptr) return {};
  Bitmap cpus, nodes;
  if (hwloc_get_cpubind(topo, cpus.b, HWLOC_CPUBIND_THREAD) == 0) {
    hwloc_cpuset_to_nodeset(topo, cpus.b, nodes.b);
    const bool bound = !hwloc_bitmap_isequal(nodes.b, hwloc_get_root_obj(topo)->nodeset);
    if (bound && !hwloc_bitmap_iszero(nodes.b)) return to_vector(nodes.b);
  }
  // Unbound: the node of the CPU the thread is on now.
  if (hwloc_get_last_cpu_location(topo, cpus.b, HWLOC_CPUBIND_THREAD) == 0) {
    hwloc_cpuset_to_nodeset(topo, cpus.b, nodes.b);
    if (!hwloc_bitmap_iszero(nodes.b)) return to_vector(nodes.b);
  }
  return to_vector(hwloc_get_root_obj(topo)->nodeset);
}

int numa_node_count() {
  hwloc_topology_t topo = Topology::get().handle();
  if (topo == nullptr) return 1;
  const int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  return n > 0 ? n : 1;
}

}  // namespace stowage::detail

namespace stowage {

std::vector<int> nearest_numa_nodes(const Device& device) { return device.properties().numa_nodes; }
std::vector<int> current_thread_numa_nodes() { return detail::current_thread_numa_nodes(); }
int numa_node_count() { return detail::numa_node_count(); }

}  // namespace stowage
