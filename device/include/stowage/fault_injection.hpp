#pragma once
// A device adaptor that makes every Nth operation of a kind fail, to check that everything
// above the device layer surfaces errors cleanly and loses nothing.
#include <cstdint>
#include <memory>
#include <string>

#include "stowage/device.hpp"

namespace stowage {

// 0 = never fail. "Every Nth" counts calls of that kind from the adaptor's creation.
struct FaultPlan {
  std::uint64_t allocation_every = 0;  // allocate, create_physical      -> OutOfMemory
  std::uint64_t map_every = 0;         // reserve, map, set_access       -> DeviceError
  std::uint64_t pin_every = 0;         // pin_host                       -> DeviceError
  std::uint64_t copy_every = 0;        // copy_async, fill_async         -> DeviceError
  std::uint64_t record_every = 0;      // record (an event on a stream)  -> DeviceError
  bool any() const { return allocation_every || map_every || pin_every || copy_every || record_every; }
};

// Parses "alloc=7,map=5,pin=3,copy=11,record=13" (the STOWAGE_FAULTS variable). ParseError on bad input.
FaultPlan parse_fault_plan(const std::string& text);

struct FaultCounts {
  std::uint64_t allocation = 0, map = 0, pin = 0, copy = 0, record = 0;  // faults injected so far
};

class FaultInjectingDevice : public Device {
 public:
  FaultInjectingDevice(std::unique_ptr<Device> inner, FaultPlan plan);
  ~FaultInjectingDevice() override;

  FaultCounts injected() const;
  void set_plan(FaultPlan plan);  // resets the call counters
  Device& inner() { return *inner_; }

  const DeviceProperties& properties() const override;
  std::size_t free_memory() const override;
  DeviceCounters counters() const override;
  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr) override;
  void* reserve(std::size_t bytes) override;
  void unreserve(void* base, std::size_t bytes) override;
  PhysicalHandle create_physical(std::size_t bytes, const PhysicalOptions& options = {}) override;
  void destroy_physical(PhysicalHandle handle) override;
  void map(void* va, std::size_t bytes, PhysicalHandle handle, std::size_t offset = 0) override;
  void unmap(void* va, std::size_t bytes) override;
  void set_access(void* va, std::size_t bytes) override;
  int export_handle(PhysicalHandle handle) override;
  Stream create_stream(int priority = 0) override;
  void destroy_stream(Stream stream) override;
  void check_stream(Stream stream) override;
  std::pair<int, int> priority_range() const override;
  void synchronize(Stream stream) override;
  void synchronize() override;
  Event create_event(bool timing = false) override;
  void destroy_event(Event event) override;
  void record(Event event, Stream stream) override;
  void wait(Stream stream, Event event) override;
  bool query(Event event) override;
  void synchronize(Event event) override;
  float elapsed_ms(Event start, Event end) override;
  void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream stream) override;
  void fill_async(void* dst, std::uint8_t value, std::size_t bytes, Stream stream) override;
  void pin_host(void* ptr, std::size_t bytes) override;
  void unpin_host(void* ptr) override;
  bool is_pinned(const void* ptr) const override;
  void* device_pointer_of_host(void* host_ptr) override;
  void launch_host(Stream stream, std::function<void()> fn) override;

 private:
  struct State;
  std::unique_ptr<Device> inner_;
  std::unique_ptr<State> state_;
};

}  // namespace stowage
