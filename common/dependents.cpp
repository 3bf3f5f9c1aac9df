#include "stowage/dependents.hpp"

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "common/fatal.hpp"
#include "common/fork_generation.hpp"

namespace stowage {

namespace {
constexpr std::size_t kNamesShown = 8;  // in the fatal message; the count says how many there are
}  // namespace

namespace detail {
struct DependentList {
  // Read without the lock: an owner's destructor takes none when nothing depends on it (a lock
  // held by a thread fork() did not copy stays held in the child).
  std::atomic<std::size_t> live{0};
  mutable std::mutex mutex;
  std::string owner;  // as the latest add() named it (the owner's name is only known when alive)
  std::uint64_t next = 1;
  std::map<std::uint64_t, std::string> dependents;  // by registration order
  // The process that made the list: in a forked child, the mutex may be held for ever by a parent
  // thread fork() did not copy, and nothing made in the parent is usable anyway.
  unsigned generation = fork_generation();
};
}  // namespace detail

Dependents::Dependents() : list_(std::make_shared<detail::DependentList>()) {}

Dependents::~Dependents() { check_none_left(); }

Dependency Dependents::add(std::string owner, std::string dependent) {
  std::lock_guard lock(list_->mutex);
  const std::uint64_t id = list_->next++;
  list_->dependents.emplace(id, std::move(dependent));
  list_->owner = std::move(owner);
  list_->live.fetch_add(1, std::memory_order_release);
  return Dependency(list_, id);
}

std::size_t Dependents::count() const { return list_->live.load(std::memory_order_acquire); }

void Dependents::check_none_left() const noexcept {
  if (count() == 0 || forked_since(list_->generation)) return;
  std::unique_lock lock(list_->mutex, std::try_to_lock);  // the names, if they can be had
  if (lock.owns_lock() && !list_->dependents.empty()) {
    try {
      std::string names;
      std::size_t shown = 0;
      for (const auto& [id, name] : list_->dependents)
        if (shown++ < kNamesShown) names += (names.empty() ? "" : ", ") + name;
      if (shown > kNamesShown) names += fmt::format(" and {} more", shown - kNamesShown);
      detail::fatal(fmt::format(
          "{} destroyed while {} object(s) made on it still live: {}. Destroy them before it (declare it first, or "
          "reset them first): going on would use memory, streams or pages that are gone. See docs/architecture.md, "
          "\"Lifetimes\"",
          list_->owner, list_->dependents.size(), names));
    } catch (...) {
    }
  }
  detail::fatal("an owner (a device or a host pool) destroyed while objects made on it still live");
}

Dependency::Dependency(std::shared_ptr<detail::DependentList> list, std::uint64_t id)
    : list_(std::move(list)), id_(id) {}

Dependency::~Dependency() { reset(); }

Dependency::Dependency(Dependency&& other) noexcept
    : list_(std::exchange(other.list_, nullptr)), id_(std::exchange(other.id_, 0)) {}

Dependency& Dependency::operator=(Dependency&& other) noexcept {
  if (this != &other) {
    reset();
    list_ = std::exchange(other.list_, nullptr);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

void Dependency::reset() noexcept {
  if (!list_) return;
  if (forked_since(list_->generation)) {  // the count only, and no lock (see DependentList)
    list_->live.fetch_sub(1, std::memory_order_release);
  } else {
    std::lock_guard lock(list_->mutex);
    list_->dependents.erase(id_);
    list_->live.fetch_sub(1, std::memory_order_release);
  }
  list_.reset();
  id_ = 0;
}

}  // namespace stowage
