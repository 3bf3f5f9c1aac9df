#pragma once
// Live blocks by address: an open-addressing hash map (linear probing, backward-shift delete)
// so the allocation hot path does not allocate a node per block as std::unordered_map would.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace stowage::detail {

struct Block;

class AddressMap {
 public:
  explicit AddressMap(std::size_t slots = 1024) : slots_(slots) {}  // slots: a power of two

  Block* find(std::uintptr_t key) const {
    for (std::size_t i = index(key);; i = (i + 1) & mask()) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.value;
      if (s.key == 0) return nullptr;
    }
  }

  void insert(std::uintptr_t key, Block* value) {  // key must be absent and nonzero
    if ((size_ + 1) * 2 > slots_.size()) grow();
    place(key, value);
    ++size_;
  }

  bool erase(std::uintptr_t key) {
    std::size_t i = index(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return false;
      i = (i + 1) & mask();
    }
    // Shift later entries of the probe chain back so lookups never meet a hole.
    for (std::size_t j = (i + 1) & mask(); slots_[j].key != 0; j = (j + 1) & mask()) {
      const std::size_t home = index(slots_[j].key);
      if (((j - home) & mask()) >= ((j - i) & mask())) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
    return true;
  }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  struct Slot {
    std::uintptr_t key = 0;
    Block* value = nullptr;
  };

  std::size_t mask() const { return slots_.size() - 1; }
  std::size_t index(std::uintptr_t key) const {
    return static_cast<std::size_t>(((key >> 9) * 0x9E3779B97F4A7C15ull) >> 20) & mask();
  }
  void place(std::uintptr_t key, Block* value) {
    std::size_t i = index(key);
    while (slots_[i].key != 0) i = (i + 1) & mask();
    slots_[i] = {key, value};
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& s : old) {
      if (s.key != 0) place(s.key, s.value);
    }
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace stowage::detail
