import { fireEvent, render, screen } from '@testing-library/react'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { issuesByField } from '../api'
import { formFromConfig } from '../jobForm'
import type { ParsedConfig } from '../types'
import { jsonResponse } from '../test/fixtures'
import { ConfigFileLoader } from './ConfigFileLoader'

afterEach(() => vi.unstubAllGlobals())

const parsed: ParsedConfig = {
  source: 'axolotl', valid: false,
  spec: { method: 'qlora', model: 'Qwen/Qwen2.5-0.5B', name: 'mine', lora: { rank: 0 }, hyperparameters: { learning_rate: 0.0002 } },
  errors: [{ loc: ['body', 'lora', 'rank'], msg: 'Input should be greater than or equal to 1', type: 'greater_than_equal' }],
  unmapped: ['optimizer'],
  notes: ['The file names its data (datasets: alpaca); pick one'],
}

describe('ConfigFileLoader', () => {
  it('sends the pasted YAML, hands the parsed spec on and says what did not map', async () => {
    const bodies: unknown[] = []
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(async (_input, init) => {
      bodies.push(JSON.parse(String(init?.body)))
      return jsonResponse(parsed)
    }))
    const onLoaded = vi.fn()
    render(<ConfigFileLoader onLoaded={onLoaded} />)
    fireEvent.change(screen.getByLabelText('Or paste it'), { target: { value: 'base_model: Qwen/Qwen2.5-0.5B\n' } })
    fireEvent.click(screen.getByRole('button', { name: 'Read' }))
    await vi.waitFor(() => expect(onLoaded).toHaveBeenCalledWith(parsed))
    expect(bodies).toEqual([{ text: 'base_model: Qwen/Qwen2.5-0.5B\n' }])
    expect(screen.getByTestId('config-loaded').textContent).toContain('Not mapped: optimizer')
    expect(screen.getByText(/pick one/)).toBeTruthy()
  })

  it('shows a refusal in words', async () => {
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockResolvedValue(jsonResponse({ detail: 'The file is not valid YAML: …' }, 422)))
    render(<ConfigFileLoader onLoaded={vi.fn()} />)
    fireEvent.change(screen.getByLabelText('Or paste it'), { target: { value: 'method: [' } })
    fireEvent.click(screen.getByRole('button', { name: 'Read' }))
    expect((await screen.findByRole('alert')).textContent).toContain('not valid YAML')
  })
})

describe('a parsed config in the form', () => {
  it('keeps the file’s name and marks its errors by field', () => {
    const form = formFromConfig(parsed.spec, 'builtin/x', false)
    expect(form.name).toBe('mine')
    expect(form.method).toBe('qlora')
    expect(form.values['lora.rank']).toBe('0')
    expect(form.datasetId).toBe('')
    expect(issuesByField(parsed.errors)).toEqual({ 'lora.rank': 'Input should be greater than or equal to 1' })
  })
})
