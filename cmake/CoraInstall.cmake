# Install rules and the package config: find_package(cora) gives cora::cora, cora::acl,
# cora::kernel_headers, cora::pack and cora_add_kernel_binary().
include(CMakePackageConfigHelpers)
