#pragma once
// The allocator layer in one include: memory resources, the caching allocator and its options,
// statistics, snapshots and tags.
#include "stowage/allocator_options.hpp"
#include "stowage/allocator_stats.hpp"
#include "stowage/caching_allocator.hpp"
#include "stowage/memory_resource.hpp"
#include "stowage/scoped_tag.hpp"
#include "stowage/snapshot.hpp"
