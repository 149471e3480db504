// The calling process's thread count, read from /proc/self/task (tests and
// benches that check a call holds no thread). Linux only.
#pragma once

#include <dirent.h>

namespace graphrun::testing {

// -1 when /proc/self/task cannot be read.
inline int process_thread_count() {
  int n = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

}  // namespace graphrun::testing
