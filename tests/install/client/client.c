/* An external program built against an installed libtandem (tests/install):
 * once with pkg-config, once with find_package(tandem). Without a daemon a
 * runner opens fail-open, so this runs anywhere. Prints one line per check;
 * exits nonzero on the first failure. */
#include <stdio.h>
#include <string.h>

#include <tandem/tandem.h>

int main(int argc, char** argv) {
  const char* runtime_dir = argc > 1 ? argv[1] : "/nonexistent/tandem-install-test";
  printf("api %d\n", TANDEM_API_VERSION);
  printf("session_id %llu\n", (unsigned long long)tandem_session_id("install-test"));

  tandem_options opts;
  memset(&opts, 0, sizeof opts);
  opts.sz = sizeof opts;
  opts.runtime_dir = runtime_dir;
  opts.name = "install-test";
  tandem_client* client = NULL;
  int rc = tandem_runner_open(&opts, &client);
  if (rc != 0 || client == NULL) {
    fprintf(stderr, "tandem_runner_open: %d\n", rc);
    return 1;
  }
  printf("runner open, connected %d\n", tandem_connected(client));
  tandem_close(client);
  printf("closed\n");
  return 0;
}
