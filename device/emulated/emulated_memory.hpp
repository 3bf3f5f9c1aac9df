#pragma once
// The emulated device's memory: raw allocations, virtual-address reservations and physical
// chunks (memfd-backed, so one chunk can be mapped at several addresses), all counted against
// the device's capacity where they live on the device.
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "stowage/device.hpp"

namespace stowage::emulated {

class Memory {
 public:
  Memory(int ordinal, std::size_t capacity, std::size_t granularity);
  ~Memory();

  std::size_t used() const;
  std::size_t capacity() const { return capacity_; }
  DeviceCounters counters() const;

  void* allocate(std::size_t bytes);
  void deallocate(void* ptr);

  void* reserve(std::size_t bytes);
  void unreserve(void* base, std::size_t bytes);
  PhysicalHandle create_physical(std::size_t bytes, const PhysicalOptions& options);
  void destroy_physical(PhysicalHandle handle);
  void map(void* va, std::size_t bytes, PhysicalHandle handle, std::size_t offset);
  void unmap(void* va, std::size_t bytes);
  void set_access(void* va, std::size_t bytes);
  int export_handle(PhysicalHandle handle);

  void pin(void* ptr, std::size_t bytes);
  void unpin(void* ptr);
  bool is_pinned(const void* ptr) const;

 private:
  struct Chunk {
    int fd = -1;
    std::size_t size = 0;
    PhysicalOptions options;
    int mappings = 0;
    bool destroyed = false;  // released while mapped: freed at the last unmap
  };
  struct Mapping {
    std::size_t size = 0;
    std::uintptr_t chunk = 0;
    bool accessible = false;
  };
  struct Reservation {
    std::size_t size = 0;
    void* raw = nullptr;  // the mmap behind it, aligned up to granularity
    std::size_t raw_size = 0;
    std::map<std::uintptr_t, Mapping> mappings;  // by address
  };

  std::string where() const;
  void check_granular(std::size_t value, const char* what) const;
  Reservation& reservation_of(std::uintptr_t va, std::size_t bytes, const char* op);
  void charge(std::size_t bytes, const char* what);
  void drop_chunk_ref(std::uintptr_t id);

  const int ordinal_;
  const std::size_t capacity_, granularity_;
  mutable std::mutex mutex_;
  std::size_t used_ = 0;
  DeviceCounters counters_;
  std::map<std::uintptr_t, std::size_t> raw_;  // raw allocations by address
  std::map<std::uintptr_t, Reservation> reservations_;
  std::map<std::uintptr_t, Chunk> chunks_;
  std::uintptr_t next_chunk_ = 1;
  std::map<std::uintptr_t, std::size_t> pinned_;
};

}  // namespace stowage::emulated
