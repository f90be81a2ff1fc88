#include "server/regions/memory_regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/shared_memory_buffer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashsampler {
namespace {

using ::testing::HasSubstr;

// A shared-memory object unique to this process and test.
std::unique_ptr<SharedMemoryBuffer> MakeBuffer(const std::string& tag, size_t bytes) {
  absl::StatusOr<std::unique_ptr<SharedMemoryBuffer>> b =
      SharedMemoryBuffer::Create(absl::StrCat("/fs-regions-test-", getpid(), "-", tag), bytes);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *std::move(b) : nullptr;
}

void ExpectCode(const absl::Status& s, absl::StatusCode code, const std::string& fragment) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(fragment));
}

TEST(MemoryRegions, ReadsAndWritesTheRegisteredRangeOfTheObject) {
  auto buffer = MakeBuffer("rw", 4096);
  for (size_t i = 0; i < 4096; ++i) buffer->data()[i] = static_cast<uint8_t>(i * 7);
  MemoryRegions regions(MemoryRegionsOptions{});
  // The region starts 1000 bytes into the object.
  ASSERT_TRUE(regions.RegisterSystemSharedMemory("r", buffer->key(), 1000, 2000).ok());

  absl::StatusOr<RegionSlice> slice = regions.Resolve("r", 100, 50, "f");
  ASSERT_TRUE(slice.ok()) << slice.status();
  std::vector<uint8_t> got(50);
  ASSERT_TRUE(slice->Read(got.data()).ok());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], static_cast<uint8_t>((1100 + i) * 7)) << i;

  const std::vector<uint8_t> put = {1, 2, 3, 4, 5};
  ASSERT_TRUE(slice->Write(put.data(), put.size()).ok());
  EXPECT_EQ(std::memcmp(buffer->data() + 1100, put.data(), put.size()), 0);
  EXPECT_EQ(buffer->data()[1105], static_cast<uint8_t>(1105 * 7));  // nothing past the write

  std::vector<RegionDescription> list = regions.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].name, "r");
  EXPECT_EQ(list[0].key, buffer->key());
  EXPECT_EQ(list[0].offset, 1000u);
  EXPECT_EQ(list[0].byte_size, 2000u);
  EXPECT_EQ(list[0].kind, RegionDescription::Kind::kSystemSharedMemory);
  EXPECT_FALSE(list[0].read_in_place);  // no engine reads on a GPU here
  EXPECT_EQ(slice->region->DeviceAddressOf(0, 1).data, nullptr);
}

TEST(MemoryRegions, RegistrationChecksNameKeySizeAndTheObject) {
  auto buffer = MakeBuffer("reg", 1024);
  MemoryRegions regions(MemoryRegionsOptions{});
  const std::string key = buffer->key();
  ExpectCode(regions.RegisterSystemSharedMemory("", key, 0, 1), absl::StatusCode::kInvalidArgument, "1 to 128");
  ExpectCode(regions.RegisterSystemSharedMemory(std::string(129, 'a'), key, 0, 1),
             absl::StatusCode::kInvalidArgument, "1 to 128");
  ExpectCode(regions.RegisterSystemSharedMemory("a/b", key, 0, 1), absl::StatusCode::kInvalidArgument,
             "[A-Za-z0-9_.-]");
  ExpectCode(regions.RegisterSystemSharedMemory("r", key, 0, 0), absl::StatusCode::kInvalidArgument, ">= 1");
  ExpectCode(regions.RegisterSystemSharedMemory("r", "no-slash", 0, 1), absl::StatusCode::kInvalidArgument,
             "shm_open");
  ExpectCode(regions.RegisterSystemSharedMemory("r", "/a/b", 0, 1), absl::StatusCode::kInvalidArgument,
             "shm_open");
  ExpectCode(regions.RegisterSystemSharedMemory("r", "/", 0, 1), absl::StatusCode::kInvalidArgument, "shm_open");
  ExpectCode(regions.RegisterSystemSharedMemory("r", absl::StrCat("/fs-regions-test-absent-", getpid()), 0, 1),
             absl::StatusCode::kNotFound, "create it");
  // Past the object's end, including offsets that would overflow.
  ExpectCode(regions.RegisterSystemSharedMemory("r", key, 0, 1025), absl::StatusCode::kInvalidArgument,
             "does not fit");
  ExpectCode(regions.RegisterSystemSharedMemory("r", key, 1000, 25), absl::StatusCode::kInvalidArgument,
             "does not fit");
  ExpectCode(regions.RegisterSystemSharedMemory("r", key, std::numeric_limits<uint64_t>::max(), 2),
             absl::StatusCode::kInvalidArgument, "does not fit");
  EXPECT_TRUE(regions.List().empty());

  ASSERT_TRUE(regions.RegisterSystemSharedMemory("r", key, 1000, 24).ok());
  ExpectCode(regions.RegisterSystemSharedMemory("r", key, 0, 1), absl::StatusCode::kAlreadyExists, "already");
}

TEST(MemoryRegions, CudaIpcIsRefusedWithoutAGpuEngineAndForOtherDevices) {
  MemoryRegions regions(MemoryRegionsOptions{});
  const std::string handle(64, '\0');
  ExpectCode(regions.RegisterCudaIpc("g", handle, 0, 0, 16), absl::StatusCode::kInvalidArgument,
             "need the cuda backend");
  regions.SetCudaDevices({0, 1});
  ExpectCode(regions.RegisterCudaIpc("g", handle, 3, 0, 16), absl::StatusCode::kInvalidArgument,
             "runs on device(s) 0,1");
  EXPECT_TRUE(regions.List().empty());
}

TEST(MemoryRegions, LimitAndOff) {
  auto buffer = MakeBuffer("limit", 64);
  MemoryRegions two(MemoryRegionsOptions{2});
  ASSERT_TRUE(two.RegisterSystemSharedMemory("a", buffer->key(), 0, 8).ok());
  ASSERT_TRUE(two.RegisterSystemSharedMemory("b", buffer->key(), 8, 8).ok());
  ExpectCode(two.RegisterSystemSharedMemory("c", buffer->key(), 16, 8), absl::StatusCode::kResourceExhausted,
             "--max_regions");
  ASSERT_TRUE(two.Unregister("a").ok());
  EXPECT_TRUE(two.RegisterSystemSharedMemory("c", buffer->key(), 16, 8).ok());

  MemoryRegions off(MemoryRegionsOptions{0});
  ExpectCode(off.RegisterSystemSharedMemory("a", buffer->key(), 0, 8), absl::StatusCode::kFailedPrecondition,
             "--max_regions=0");
}

TEST(MemoryRegions, ResolveChecksEverySliceBound) {
  auto buffer = MakeBuffer("resolve", 256);
  MemoryRegions regions(MemoryRegionsOptions{});
  ASSERT_TRUE(regions.RegisterSystemSharedMemory("r", buffer->key(), 0, 100).ok());
  ExpectCode(regions.Resolve("nope", 0, 1, "hidden_states_region").status(), absl::StatusCode::kNotFound,
             "hidden_states_region.region \"nope\" is not registered");
  EXPECT_TRUE(regions.Resolve("r", 0, 100, "f").ok());
  EXPECT_TRUE(regions.Resolve("r", 99, 1, "f").ok());
  ExpectCode(regions.Resolve("r", 0, 0, "f").status(), absl::StatusCode::kInvalidArgument, "empty");
  ExpectCode(regions.Resolve("r", 0, 101, "f").status(), absl::StatusCode::kInvalidArgument, "not inside");
  ExpectCode(regions.Resolve("r", 100, 1, "f").status(), absl::StatusCode::kInvalidArgument, "not inside");
  ExpectCode(regions.Resolve("r", 101, 0, "f").status(), absl::StatusCode::kInvalidArgument, "empty");
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  ExpectCode(regions.Resolve("r", max, 2, "f").status(), absl::StatusCode::kInvalidArgument, "not inside");
  ExpectCode(regions.Resolve("r", 2, max, "f").status(), absl::StatusCode::kInvalidArgument, "not inside");
}

TEST(MemoryRegions, ASliceInUseOutlivesUnregister) {
  auto buffer = MakeBuffer("outlive", 64);
  buffer->data()[5] = 42;
  MemoryRegions regions(MemoryRegionsOptions{});
  ASSERT_TRUE(regions.RegisterSystemSharedMemory("r", buffer->key(), 0, 64).ok());
  absl::StatusOr<RegionSlice> slice = regions.Resolve("r", 5, 1, "f");
  ASSERT_TRUE(slice.ok());
  ASSERT_TRUE(regions.Unregister("r").ok());
  ExpectCode(regions.Unregister("r"), absl::StatusCode::kNotFound, "no region named");
  ExpectCode(regions.Resolve("r", 5, 1, "f").status(), absl::StatusCode::kNotFound, "not registered");
  uint8_t got = 0;
  ASSERT_TRUE(slice->Read(&got).ok());  // the descriptor is still open
  EXPECT_EQ(got, 42);
}

TEST(MemoryRegions, AnObjectTruncatedAfterRegistrationIsAnErrorNotACrash) {
  auto buffer = MakeBuffer("truncate", 8192);
  MemoryRegions regions(MemoryRegionsOptions{});
  ASSERT_TRUE(regions.RegisterSystemSharedMemory("r", buffer->key(), 0, 8192).ok());
  const int fd = shm_open(buffer->key().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 100), 0);
  close(fd);
  absl::StatusOr<RegionSlice> slice = regions.Resolve("r", 4096, 4096, "f");
  ASSERT_TRUE(slice.ok());
  std::vector<uint8_t> got(4096);
  ExpectCode(slice->Read(got.data()), absl::StatusCode::kInvalidArgument, "truncated after registration");
}

}  // namespace
}  // namespace flashsampler
