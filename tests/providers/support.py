"""What the provider tests share: one seal key and the provider set built on it."""

from polar.providers import ProviderSet, Sealer

SEALER = Sealer(b"polar-provider-tests-seal-key-32")
PROVIDERS = ProviderSet(SEALER)
