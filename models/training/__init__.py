"""Training blocks any family's student or pruned part can use: spectral losses, HiFi-GAN
discriminators, the learning-rate schedule, teacher-latent datasets and the decoder trainer,
convolution resizing and pruning saliency. Torch, numpy and safetensors only, so a GPU machine
runs them as they are."""
