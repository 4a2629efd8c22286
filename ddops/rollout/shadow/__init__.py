"""Shadow rollouts: `lifecycle` starts, compares, promotes and aborts a `<service>-shadow` unit;
`compare` replays `prompts` to two endpoints, `stats` and `judge` are the pure arithmetic and
verdict, `tables` renders them."""
