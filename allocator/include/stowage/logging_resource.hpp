#pragma once
// An adaptor that writes every allocation and free passing through it to an event log, over any
// upstream resource. Calls are serialised so that a free always precedes, in the file, the
// allocation that reuses its address.
#include <memory>
#include <mutex>
#include <unordered_map>

#include "stowage/event_log.hpp"
#include "stowage/memory_resource.hpp"

namespace stowage {

class LoggingResource final : public MemoryResource {
 public:
  // InvalidArgument when `log` is null.
  LoggingResource(ResourceHandle upstream, std::shared_ptr<EventLog> log);
  Device& device() const override { return upstream_->device(); }
  MemoryResource* upstream() const override { return upstream_.raw(); }
  EventLog& log() const { return *log_; }

 protected:
  void* do_allocate(std::size_t bytes, Stream stream) override;
  // Logs the size asked for at allocation when the caller passes 0.
  void do_deallocate(void* ptr, std::size_t bytes) override;
  void do_record_stream(void* ptr, Stream stream) override { upstream_->record_stream(ptr, stream); }

 private:
  ResourceHandle upstream_;
  std::shared_ptr<EventLog> log_;
  std::mutex mutex_;
  std::unordered_map<const void*, std::pair<std::size_t, Stream>> live_;  // size asked for, stream
};

}  // namespace stowage
