"""`ShardedStateLoader._filter_subtensors`, vLLM 0.33's code as it is
(model_executor/model_loader/sharded_state_loader.py:137-172): which tensors of a state_dict are
kept, aliases and views inside other tensors dropped. Kept verbatim because what it drops decides
what the plugin sees: tensors on the meta device all start at address 0 and collapse into one."""

import collections


class ShardedStateLoader:
    @staticmethod
    def _filter_subtensors(tensors):
        same_storage_groups = collections.defaultdict(list)
        for key, tensor in tensors.items():
            if tensor.numel():
                ptr = tensor.untyped_storage().data_ptr()
                same_storage_groups[tensor.device, ptr].append((key, tensor))

        def get_end_ptr(tensor):
            return tensor.view(-1)[-1].data_ptr() + tensor.element_size()

        result = {}
        for group in same_storage_groups.values():
            for k, t in group:
                a, b = t.data_ptr(), get_end_ptr(t)
                for k2, t2 in group:
                    if not t2.is_contiguous():
                        continue
                    a2, b2 = t2.data_ptr(), get_end_ptr(t2)
                    if a < a2 or b2 < b:
                        continue
                    if a2 < a or b < b2 or not t.is_contiguous():
                        break  # t2 covers strictly more memory than t.
                    if k2 < k:
                        # Same tensors, keep the one with the smaller key.
                        break
                else:
                    result[k] = t
        return result
