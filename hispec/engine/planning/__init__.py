"""What a round runs, decided before it runs: the round as a value and its expected rate (round), the
policies that plan one per round (policy), the pass costs measured on this machine (costs) and the
acceptance priors a model ships (priors). The decode loop (engine.decoding) runs what they plan."""
