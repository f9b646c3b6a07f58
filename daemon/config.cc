// daemon/config: written by the config work of issue 5.
