def attention(query, key, value, block_mask=None, enable_gqa=False)
    return query
