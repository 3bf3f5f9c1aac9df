#pragma once
// Lifetimes: an object others are made on must outlive them (a device its allocators, host pools
// and stream handles; a host pool the schedulers and optimizers keeping buffers in it). The owner
// keeps a Dependents list and each dependent holds a Dependency on it while it lives. An owner
// destroyed while its list is not empty ends the process with a message naming both: its
// dependents would be left with memory, streams or host pages that are gone, and a destructor
// cannot throw. A clear abort at the mistake beats a crash (or silent corruption) later.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace stowage {

namespace detail {
struct DependentList;
}

class Dependency;

class Dependents {
 public:
  Dependents();
  ~Dependents();  // check_none_left()
  Dependents(const Dependents&) = delete;
  Dependents& operator=(const Dependents&) = delete;

  // Registers `dependent` ("CachingAllocator 0x…") on `owner` ("device 0 (emulated)"); the
  // registration lasts as long as the returned Dependency.
  Dependency add(std::string owner, std::string dependent);
  std::size_t count() const;
  // Ends the process, naming the owner and every dependent, when any is registered. Owners call it
  // first thing in their destructor, before they tear anything down.
  void check_none_left() const noexcept;

 private:
  std::shared_ptr<detail::DependentList> list_;
};

// A dependent's registration on its owner; ends when destroyed or reset. Move-only.
class Dependency {
 public:
  Dependency() = default;
  ~Dependency();
  Dependency(Dependency&& other) noexcept;
  Dependency& operator=(Dependency&& other) noexcept;
  Dependency(const Dependency&) = delete;
  Dependency& operator=(const Dependency&) = delete;

  void reset() noexcept;
  bool active() const { return list_ != nullptr; }

 private:
  friend class Dependents;
  Dependency(std::shared_ptr<detail::DependentList> list, std::uint64_t id);
  std::shared_ptr<detail::DependentList> list_;  // shared: a dependent never points at a freed list
  std::uint64_t id_ = 0;
};

}  // namespace stowage
