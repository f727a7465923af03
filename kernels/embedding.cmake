cutrain_add_kernel(embedding SOURCES ${CMAKE_CURRENT_LIST_DIR}/embedding.cu)
